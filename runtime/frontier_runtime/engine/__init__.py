"""The inference engine: sequences, paged KV cache, scheduler, model runner, sampler.

``api`` holds the public types (torch-free); ``llm_engine.LLMEngine`` steps a batch on the calling
thread; ``loop.AsyncEngine`` runs it on a background thread for asyncio code (the server's
``EngineClient``); ``config.EngineConfig`` is every setting, fixed at start.
"""
