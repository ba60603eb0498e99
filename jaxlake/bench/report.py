"""The report of ``python -m jaxlake.bench``: what its measurements (:mod:`jaxlake.bench.throughput`) mean
side by side, and the files they are written to.

* :func:`peer_ratios`: ours against each peer simulator at the same environment and batch (the
  like-for-like rows of ``bench.like_for_like`` are set side by side by
  :func:`jaxlake.bench.kinds.like_for_like`);
  :func:`autoreset_overheads`: the cost of auto-reset against the plain rollout;
* :func:`format_report`: the markdown tables printed at the end of a run;
* :func:`write_outputs`: ``bench.json``, ``bench.csv`` and the throughput plot ``bench.png``
  (:func:`plot_throughput`), each written atomically.
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from jaxlake.config import LakeConfig
from jaxlake.io import write_bytes, write_json, write_text


def _find(results: Sequence[dict], kind: str, env_name: str, batch: Optional[int] = None) -> Optional[dict]:
    rows = [r for r in results if r["kind"] == kind and r["env"] == env_name and r["status"] == "ok"]
    if batch is not None:
        exact = [r for r in rows if r["batch_size"] == batch]
        if exact:
            return exact[0]
    return max(rows, key=lambda r: r["agent_steps_per_s"], default=None) if rows else None


def peer_ratios(results: Sequence[dict], peer_rows: Sequence[dict], envs: Mapping[str, LakeConfig],
                batch: int) -> list[dict]:
    """Ours / theirs in agent-steps/s, matched on (height, width, num_agents) when we ran it."""
    ratios = []
    for p in peer_rows:
        if p.get("status") != "ok" or not p.get("agent_steps_per_s"):
            continue
        env_name = p["env"]
        for name, cfg in envs.items():  # an env with the peer's exact shape wins
            if (cfg.height, cfg.width, cfg.num_agents) == (p.get("height"), p.get("width"), p.get("num_agents")):
                env_name = name
                break
        plain = _find(results, "rollout", env_name, batch)
        auto = _find(results, "rollout_autoreset", env_name, batch)
        observed = bool((plain or auto or {}).get("observations", False))
        if p.get("obs_mode", "returned" if observed else "none") != ("returned" if observed else "none"):
            continue  # a like-for-like row of the Connector (bench.like_for_like), not for these rollouts
        ours = plain["agent_steps_per_s"] if plain else None
        ours_auto = auto["agent_steps_per_s"] if auto else None
        theirs = float(p["agent_steps_per_s"])
        theirs_cpu = p.get("agent_steps_per_cpu_s")
        ratios.append({
            "peer": p["peer"], "system": p.get("system", p["peer"]), "env": env_name,
            "batch_size": (plain or auto or {}).get("batch_size"),
            "peer_agent_steps_per_s": theirs,
            "ours_agent_steps_per_s": ours, "ours_autoreset_agent_steps_per_s": ours_auto,
            "ratio": None if ours is None else ours / theirs,
            "ratio_autoreset": None if ours_auto is None else ours_auto / theirs,
            "ratio_cpu": None if not (plain and theirs_cpu) else plain["agent_steps_per_cpu_s"] / theirs_cpu,
        })
    return ratios


def autoreset_overheads(results: Sequence[dict]) -> list[dict]:
    """Plain vs auto-reset agent-steps/s for every (env, batch) measured both ways."""
    rows = []
    for plain in results:
        if plain["kind"] != "rollout" or plain["status"] != "ok":
            continue
        auto = next((r for r in results if r["kind"] == "rollout_autoreset" and r["status"] == "ok"
                     and r["env"] == plain["env"] and r["batch_size"] == plain["batch_size"]), None)
        if auto is None:
            continue
        p, a = plain["agent_steps_per_s"], auto["agent_steps_per_s"]
        rows.append({"env": plain["env"], "batch_size": plain["batch_size"],
                     "plain_agent_steps_per_s": p, "autoreset_agent_steps_per_s": a,
                     "overhead_pct": 100.0 * (p / a - 1.0)})
    return rows


# ============================================================================ outputs
def _fmt(x: Any, digits: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        if x == 0 or not math.isfinite(x):
            return f"{x:g}"
        mag = abs(x)
        for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
            if mag >= scale:
                return f"{x / scale:.{digits}g}{unit}"
        return f"{x:.{digits}g}"
    return str(x)


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [list(header)] + [[_fmt(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |" for r in cells]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def format_report(result: Mapping[str, Any]) -> str:
    """The printed tables (markdown): measurements, auto-reset overhead, peers and ratios."""
    meta = result["meta"]
    out = io.StringIO()
    out.write(f"jaxlake.bench on {meta['local_device_count']} x {meta['device_kind']} ({meta['platform']}), "
              f"jax {meta['versions']['jax']}, commit {str(meta['git_commit'])[:10]}"
              f"{' (dirty)' if meta.get('git_dirty') else ''}\n\n")
    rows = []
    for r in result["results"]:
        rate = r.get("lakes_per_s") if r["kind"] == "generator" else r.get("agent_steps_per_s")
        unit = "lakes/s" if r["kind"] == "generator" else "agent-steps/s"
        flops = r.get("flops_per_lake") if r["kind"] == "generator" else r.get("flops_per_instance_step")
        nbytes = r.get("bytes_per_lake") if r["kind"] == "generator" else r.get("bytes_per_instance_step")
        cpu_rate = r.get("lakes_per_cpu_s") if r["kind"] == "generator" else r.get("agent_steps_per_cpu_s")
        kind = f"observe {r.get('observation_kind')}" if r["kind"] == "observe" else r["kind"]
        rows.append([kind, r["env"], r["batch_size"], r["devices"], r.get("compile_s"), r.get("median_s"),
                     rate, cpu_rate, unit if r["status"] == "ok" else r["note"], r.get("env_steps_per_s"),
                     flops, nbytes, r.get("achieved_gflops"), r.get("achieved_gbytes_per_s")])
    out.write(_table(["kind", "env", "batch", "dev", "compile s", "median s", "rate", "rate per CPU-s", "unit",
                      "env-steps/s", "flops/inst", "bytes/inst", "GFLOP/s", "GB/s"], rows))
    if result.get("autoreset_overhead"):
        out.write("\n\nauto-reset overhead\n\n")
        out.write(_table(["env", "batch", "plain agent-steps/s", "auto-reset agent-steps/s", "overhead %"],
                         [[o["env"], o["batch_size"], o["plain_agent_steps_per_s"],
                           o["autoreset_agent_steps_per_s"], o["overhead_pct"]]
                          for o in result["autoreset_overhead"]]))
    if result.get("peers"):
        out.write("\n\npeers (agent-steps/s; ours at the same map size, agents and density)\n\n")
        rows = []
        for p in result["peers"]:
            if p.get("status") != "ok":
                rows.append([p.get("peer"), p.get("env"), "-", "-", "-", "-", "-", f"skipped: {p.get('note')}", "-"])
        for q in result.get("ratios", []):
            rows.append([q["system"], q["env"], q["batch_size"], q["peer_agent_steps_per_s"],
                         q["ours_agent_steps_per_s"], q["ratio"], q["ours_autoreset_agent_steps_per_s"],
                         q["ratio_autoreset"], q.get("ratio_cpu")])
        out.write(_table(["peer", "our env", "our batch", "theirs", "ours", "ours/theirs",
                          "ours (auto-reset)", "ours/theirs (auto-reset)", "ours/theirs per CPU-s"], rows))
    if result.get("like_for_like"):
        out.write("\n\nlike for like (agent-steps/s; observation bytes per lake-step; jaxlake.bench.kinds)\n\n")
        out.write(_table(["env", "ours", "peer", "batch", "ours", "theirs", "ours/theirs", "per CPU-s",
                          "our bytes", "their bytes", "target", "met"],
                         [[q["env"], q["kind"], f"{q['peer']} {q['peer_mode']}", q["batch_size"],
                           q["ours_agent_steps_per_s"], q["peer_agent_steps_per_s"], q["ratio"], q["ratio_cpu"],
                           q["ours_obs_bytes_per_lake_step"], q["peer_obs_bytes_per_lake_step"], q["target"],
                           "-" if q["met"] is None else ("yes" if q["met"] else "NO")]
                          for q in result["like_for_like"]]))
    return out.getvalue()


def _csv_rows(result: Mapping[str, Any]) -> tuple[list[str], list[dict]]:
    rows = []
    for r in result["results"]:
        flat = {k: v for k, v in r.items() if k not in ("times_s", "cpu_times_s", "stats")}
        flat["times_s"] = ";".join(f"{t:.6g}" for t in r.get("times_s", []))
        flat["cpu_times_s"] = ";".join(f"{t:.6g}" for t in r.get("cpu_times_s", []))
        for k, v in (r.get("stats") or {}).items():
            flat[f"stats_{k}"] = v
        rows.append(flat)
    for p in result.get("peers", []):
        flat = {k: v for k, v in p.items() if not isinstance(v, (list, dict))}
        flat["kind"] = "peer"
        rows.append(flat)
    fields: list[str] = []
    for row in rows:
        fields.extend(k for k in row if k not in fields)
    return fields, rows


def plot_throughput(result: Mapping[str, Any], path: Path) -> None:
    """PNG: agent-steps/s (left) and generator lakes/s (right) against batch size, per env."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_roll, ax_gen) = plt.subplots(1, 2, figsize=(13, 5))
    envs = list(dict.fromkeys(r["env"] for r in result["results"]))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, name in enumerate(envs):
        color = colors[i % len(colors)]
        for kind, style, ax, field in (("rollout", "-o", ax_roll, "agent_steps_per_s"),
                                       ("rollout_autoreset", "--s", ax_roll, "agent_steps_per_s"),
                                       ("generator", "-o", ax_gen, "lakes_per_s")):
            pts = sorted((r["batch_size"], r[field]) for r in result["results"]
                         if r["env"] == name and r["kind"] == kind and r["status"] == "ok")
            if pts:
                label = name if kind == "generator" else f"{name} ({'auto-reset' if 'auto' in kind else 'step'})"
                ax.plot(*zip(*pts), style, color=color, label=label)
    peer_styles = [":", "-.", (0, (1, 3)), (0, (5, 2, 1, 2)), (0, (3, 1, 1, 1, 1, 1))]
    peer_lines = []
    for j, q in enumerate(result.get("ratios", [])):
        line = ax_roll.axhline(q["peer_agent_steps_per_s"], color=str(0.15 + 0.5 * (j % 4) / 3),
                               ls=peer_styles[j % len(peer_styles)], lw=1.2, label=f"peer: {q['system']}")
        peer_lines.append(line)
    meta = result["meta"]
    for ax, title, ylabel in ((ax_roll, "rollout (random actions)", "agent-steps / s"),
                              (ax_gen, "generator (all guarantees on)", "lakes / s")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("batch size (lakes)")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ours = [ln for ln in ax.lines if ln not in peer_lines]
        if ours:
            first = ax.legend(handles=ours, fontsize=7, loc="upper left")
            if ax is ax_roll and peer_lines:
                ax.add_artist(first)
                ax.legend(handles=peer_lines, fontsize=6, loc="lower right", title="peers (same run)",
                          title_fontsize=7)
    fig.suptitle(f"jaxlake.bench - {meta['local_device_count']} x {meta['device_kind']}, jax {meta['versions']['jax']}")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    write_bytes(path, buf.getvalue())


def write_outputs(result: dict, out_dir: Path, *, plot: bool = True) -> list[str]:
    """Write ``bench.json``, ``bench.csv`` and (if ``plot``) ``bench.png`` into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files = ["bench.json", "bench.csv"] + (["bench.png"] if plot else [])
    result["files"] = files
    fields, rows = _csv_rows(result)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=fields)
    writer.writeheader()
    writer.writerows(rows)
    write_text(out_dir / "bench.csv", buf.getvalue())
    if plot:
        plot_throughput(result, out_dir / "bench.png")
    write_json(out_dir / "bench.json", result, indent=2)
    return files
