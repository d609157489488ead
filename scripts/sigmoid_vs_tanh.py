"""Why fused_loss.py's soft-cap goes through the sigmoid: torch's CPU sigmoid_ against tanh_.

One thread, 64 × 50304 float32 logits (one chunk of train.py's CPU loss path at GPT-2's
vocabulary) in place, at three logit scales; the median of 25 timings each. The ratio depends
on the CPU and on the kernels torch picks for it (ATEN_CPU_CAPABILITY), so it prints both.

    OMP_NUM_THREADS=1 python scripts/sigmoid_vs_tanh.py > results/sigmoid_vs_tanh.txt
"""
import platform
import time

import torch

ROWS, VOCAB, REPEATS = 64, 50304, 25


def median_seconds(x0, op):
    buf, times = torch.empty_like(x0), []
    for _ in range(REPEATS):
        buf.copy_(x0)
        t0 = time.perf_counter()
        op(buf)
        times.append(time.perf_counter() - t0)
    return sorted(times)[REPEATS // 2]


def main():
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, kernels {torch.backends.cpu.get_cpu_capability()}, "
          f"{platform.processor() or platform.machine()}, 1 thread, {ROWS} × {VOCAB} float32")
    generator = torch.Generator().manual_seed(0)
    for scale in (0.1, 1.0, 10.0):                 # 2a/c of the cap: small, typical, large
        x0 = scale * torch.randn(ROWS, VOCAB, generator=generator)
        sigmoid = median_seconds(x0, torch.Tensor.sigmoid_)
        tanh = median_seconds(x0, torch.Tensor.tanh_)
        print(f"std {scale:4}: sigmoid_ {sigmoid * 1e3:6.2f} ms, tanh_ {tanh * 1e3:6.2f} ms, "
              f"tanh_/sigmoid_ {tanh / sigmoid:5.1f}")


if __name__ == "__main__":
    main()
