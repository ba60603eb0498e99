"""Generation throughput: ours (jitted JAX KV-cache loop) vs ``transformers``' PyTorch ``generate``.

``python -m llm.benchmark`` measures, for the tiny default config and the ~100M config
(``conf/model/tiny.yaml``, ``conf/model/small_100m.yaml``), on the same machine in the same
run, with the same weights (ours are copied into the torch model), batch, prompt length and
number of new tokens, greedy decoding with EOS disabled (every row makes every token):

* **prefill tokens/s** = ``B * P / t1`` with ``t1`` the time of a 1-new-token generation
  (prefill + first token);
* **decode tokens/s** = ``B * (N - 1) / (tN - t1)`` with ``tN`` the time of an N-token
  generation.

Each timing is the best of ``--repeats`` runs after a warm-up (compilation excluded for JAX;
torch gets the same warm-up). Torch uses ``torch.set_num_threads(os.cpu_count())``. The
table reports ``ours / theirs`` ratios (> 1 means ours is faster) and the share of greedy
tokens on which both agree (same weights, so a sanity check, not a score). These are
measurements, not tests: the numbers vary with the machine and its load.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from typing import Any, Callable

import numpy as np


@dataclasses.dataclass
class Row:
    model: str
    params_m: float
    batch: int
    prompt_len: int
    new_tokens: int
    ours_prefill: float
    theirs_prefill: float
    ours_decode: float
    theirs_decode: float
    agreement: float

    @property
    def prefill_ratio(self) -> float:
        return self.ours_prefill / self.theirs_prefill

    @property
    def decode_ratio(self) -> float:
        return self.ours_decode / self.theirs_decode


def _best(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def _model_config(name: str):
    from llm.default import MODEL_CONF_DIR, default_config
    from llm.model import Qwen3Config

    if name == "tiny":
        return default_config()
    return Qwen3Config.from_yaml(MODEL_CONF_DIR / f"{name}.yaml")


def _ours(model, ids: np.ndarray, new_tokens: int, repeats: int) -> tuple[float, float, np.ndarray]:
    import jax
    from flax import nnx

    from llm.generate import GenerationConfig, generate_ids

    graphdef, state = nnx.split(model)
    mask = np.ones_like(ids, dtype=bool)

    def run(n: int):
        cfg = GenerationConfig(max_new_tokens=n, temperature=0.0, eos_token_ids=())
        out = generate_ids((graphdef, state), ids, mask, None, cfg)
        return jax.block_until_ready(out)[0]

    run(1), run(new_tokens)  # compile
    t1, _ = _best(lambda: run(1), repeats)
    tn, tokens = _best(lambda: run(new_tokens), repeats)
    return t1, tn, np.asarray(tokens)


def _theirs(model, ids: np.ndarray, new_tokens: int, repeats: int, device: str = "cpu") -> tuple[float, float, np.ndarray]:
    import torch

    from llm.hf_io import model_to_hf_tensors

    from transformers import Qwen3Config as HFConfig
    from transformers import Qwen3ForCausalLM as HFModel

    hf_cfg = HFConfig(**{k: v for k, v in model.config.to_hf_dict().items() if k not in ("architectures",)})
    torch.manual_seed(0)
    tmodel = HFModel(hf_cfg).eval().to(torch.float32)
    state = {k: torch.from_numpy(np.array(v, np.float32)) for k, v in model_to_hf_tensors(model)}
    missing, unexpected = tmodel.load_state_dict(state, strict=False)
    if unexpected or [m for m in missing if m != "lm_head.weight"]:
        raise RuntimeError(f"weight copy failed: missing={missing} unexpected={unexpected}")
    torch_device = torch.device("cuda" if device == "gpu" else "cpu")
    tmodel = tmodel.to(torch_device)
    input_ids = torch.from_numpy(ids.astype(np.int64)).to(torch_device)
    attention = torch.ones_like(input_ids)

    def run(n: int):
        with torch.inference_mode():
            out = tmodel.generate(input_ids=input_ids, attention_mask=attention, max_new_tokens=n, min_new_tokens=n,
                                  do_sample=False, eos_token_id=None, pad_token_id=0, use_cache=True)
        if torch_device.type == "cuda":
            torch.cuda.synchronize()
        return out

    run(1), run(min(new_tokens, 4))  # warm-up (no compilation to amortise)
    t1, _ = _best(lambda: run(1), repeats)
    tn, out = _best(lambda: run(new_tokens), repeats)
    return t1, tn, out[:, ids.shape[1]:].cpu().numpy()


def bench_model(name: str, batch: int, prompt_len: int, new_tokens: int, repeats: int, seed: int = 0,
                device: str = "cpu") -> Row:
    """Measure one config (see the module docstring)."""
    from flax import nnx

    from llm.model import Qwen3ForCausalLM

    config = _model_config(name)
    model = Qwen3ForCausalLM(config, rngs=nnx.Rngs(seed))
    params = config.num_parameters() / 1e6
    ids = np.random.RandomState(seed).randint(3, config.vocab_size, size=(batch, prompt_len)).astype(np.int32)
    o1, on, ours_tok = _ours(model, ids, new_tokens, repeats)
    h1, hn, their_tok = _theirs(model, ids, new_tokens, repeats, device)
    decode = batch * (new_tokens - 1)
    return Row(
        model=name, params_m=params, batch=batch, prompt_len=prompt_len, new_tokens=new_tokens,
        ours_prefill=batch * prompt_len / o1, theirs_prefill=batch * prompt_len / h1,
        ours_decode=decode / max(on - o1, 1e-9), theirs_decode=decode / max(hn - h1, 1e-9),
        agreement=float((ours_tok == their_tok).mean()),
    )


def format_table(rows: list[Row]) -> str:
    head = (f"{'model':<11}{'params':>8}{'B':>4}{'P':>5}{'N':>5} | {'prefill tok/s ours':>18}{'theirs':>10}"
            f"{'ratio':>7} | {'decode tok/s ours':>17}{'theirs':>10}{'ratio':>7} | {'agree':>6}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r.model:<11}{r.params_m:>7.1f}M{r.batch:>4}{r.prompt_len:>5}{r.new_tokens:>5} | "
            f"{r.ours_prefill:>18.0f}{r.theirs_prefill:>10.0f}{r.prefill_ratio:>7.2f} | "
            f"{r.ours_decode:>17.0f}{r.theirs_decode:>10.0f}{r.decode_ratio:>7.2f} | {r.agreement:>6.2f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[Row]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="tiny,small_100m", help="comma-separated conf/model names")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu",
                        help="where torch runs; JAX uses its default backend (set JAX_PLATFORMS)")
    parser.add_argument("--out", default=None, help="write the rows as JSON here")
    args = parser.parse_args(argv)

    import jax
    import torch

    threads = os.cpu_count() or 1
    torch.set_num_threads(threads)
    where = torch.cuda.get_device_name(0) if args.device == "gpu" else f"cpu, {threads} threads"
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}; torch {torch.__version__} on {where}")
    rows = []
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        t0 = time.perf_counter()
        rows.append(bench_model(name, args.batch, args.prompt_len, args.new_tokens, args.repeats, device=args.device))
        print(f"  {name}: measured in {time.perf_counter() - t0:.0f}s", flush=True)
    print(format_table(rows))
    if args.out:
        with open(args.out, "w") as f:
            json.dump([dict(dataclasses.asdict(r), prefill_ratio=r.prefill_ratio, decode_ratio=r.decode_ratio)
                       for r in rows], f, indent=2)
    return rows


if __name__ == "__main__":
    main()
