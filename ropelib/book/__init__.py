"""Book support: what the chapters and the benchmark need, and a user of ropelib does not.

- ``ropelib.book.baselines``: the position schemes RoPE is compared with (sinusoidal, Shaw,
  T5 buckets, ALiBi).
- ``ropelib.book.toy``: the look-back task and the small decoder of chapter 10.
- ``ropelib.book.bench``: the peer formulations and the round-robin timer behind ``make bench``,
  the eager-fallback candidates and the fused loop's traffic model, and a reader of stored
  results.
- ``ropelib.book.timing``: a call timer, the CPU-time medians chapter 11 and its appendix
  report, the last-level cache size, and log-log fits.
- ``ropelib.book.layer``: a Llama-style decoder layer whose parts chapter 11 times.
- ``ropelib.book.gpu_steps``: chapter 15's GPU kernel written step by step (Triton);
  ``ropelib.book.triton_probe``: its memory trace in Triton's interpreter and its PTX load
  counts; ``ropelib.book.gpu_runs``: its GPU timings, live, stored (with the kernels' source
  hash) or from the H200 runs made before it existed; ``ropelib.book.capture``: the host reads
  that stop a CUDA graph capture.
- ``ropelib.book.matrix``: ``rotary_matrix``, the explicit block-diagonal R_{Theta,m} the
  chapters reason with.
- ``ropelib.book.contents``: counts read from the chapters (the landing page's number of bugs).

``import ropelib`` does not import this package; the core never imports it.
"""
