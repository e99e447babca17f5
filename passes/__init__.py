"""The passes, one module each; the registry in rewriter/core/registry.py lists them."""
