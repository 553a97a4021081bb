"""The inference engine: sequences, paged KV cache, scheduler, model runner, sampler.

A request's types are :mod:`frontier_runtime.requests`, below the engine, so that
``frontier_runtime.structured`` speaks them too; ``api`` holds the client interface the server
drives (torch-free); ``llm_engine.LLMEngine`` steps a batch on the calling
thread; ``loop.AsyncEngine`` runs it on a background thread for asyncio code (the server's
``EngineClient``); ``config.EngineConfig`` is every setting, fixed at start.
"""
