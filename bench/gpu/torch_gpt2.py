"""bench_gpt_cuda's PyTorch reference: bench/common/torch_gpt.py with --device cuda (GPT-2 124M,
bf16 autocast, flash SDPA, fused AdamW; --compile adds torch.compile). Other flags pass
through. Prints "torch_gpt2 <dtype> step_ms <median> tokens/s <rate>" and a JSON: record line."""
import os
import runpy
import sys

sys.argv = [sys.argv[0], "--device", "cuda"] + sys.argv[1:]
runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common", "torch_gpt.py"), run_name="__main__")
