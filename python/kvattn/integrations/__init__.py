"""Integrations of kvattn with model libraries: `kvattn.integrations.transformers` registers
the attention implementation "kvattn" with Hugging Face transformers when imported."""
