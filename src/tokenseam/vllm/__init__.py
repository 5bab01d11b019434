"""tokenseam inside a real vLLM: the grammar engine as a structured-output backend, token healing as a v1
logits processor, and the commands that build and start such a vLLM.

Which module runs where:
- `plugin`: the `vllm.general_plugins` entry point (distribution `tokenseam-vllm`). It runs in every vLLM
  process and imports only vLLM: it adds the backend name "tokenseam" and routes requests to it.
- `backend`: the backend and its per-request grammar (vLLM's engine-core process; loads the grammar engine,
  and so numba, on first use, never in a worker).
- `healing_processor`: the logits processor (`--logits-processors tokenseam.vllm.healing_processor:
  HealingLogitsProcessor`); it needs no numba.
- `requests`, `session`: what the two above share and test without vLLM (request kinds, end tokens, exact
  rollback); `client`: builds healed requests for a vLLM server; `convert`: GGUF to a Hugging Face folder;
  `setup`, `cli`: `tokenseam vllm setup|serve`; `warm`: fills the numba cache of a vLLM environment.
"""
