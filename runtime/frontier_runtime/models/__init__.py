"""Model definitions the runtime can serve (Llama family)."""
