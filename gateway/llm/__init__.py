"""LLM providers behind one interface: builtin (offline), openai-compatible, anthropic."""
