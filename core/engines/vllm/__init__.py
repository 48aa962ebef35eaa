"""vLLM v1's own speculative decoding, recorded (docs/vllm.md). The host side only: vLLM
runs in its own venv as a subprocess (inside/driver.py) with specscope's capture plugin
(inside/capture.py); nothing here imports vllm."""
