"""`python -m via_sd profile`: the pair's measured cost profile on this machine (measured once, cached)."""

from __future__ import annotations

from .args import add_pair_arguments, pair_from_args, print_progress


def add_parser(sub) -> None:
    p = sub.add_parser("profile", help="measure (once, then cached) and print what a round costs on this machine")
    add_pair_arguments(p)
    p.add_argument("--refresh", action="store_true", help="measure again even when a cached profile fits")
    p.add_argument("--exit-layer", type=int, default=0, help="the early-exit drafter's layers (0: half of them)")
    p.add_argument("--write-prior", metavar="PATH", help="also write it as the pair's shipped prior (assets/profiles/"
                   "NAME.json: what runs on other machines price with until they have their own)")
    p.set_defaults(run=cmd_profile)


def write_prior(path: str, preset: str, profile) -> None:
    """The profile as a shipped prior ({"preset", "about", "profile"}: via_sd.core.profile.shipped_prior), saying
    where and when it was measured."""
    import datetime
    import json
    from pathlib import Path

    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    route = ", ".join(profile.key.get("route") or []) or "none"
    about = (f"the {preset} pair in {profile.key.get('weights')} on route {route}, measured by "
             f"python -m via_sd profile on {profile.key.get('device_name')}, {profile.key.get('threads')} threads, "
             f"{when}: what runs price with until this machine has its own (via_sd/core/profile.py)")
    Path(path).write_text(json.dumps({"preset": preset, "about": about, "profile": profile.to_dict()}, indent=1) + "\n")
    print(f"shipped prior written to {path}")


def cmd_profile(args) -> int:
    from ..cost.model import Rates, best_gamma, ceiling
    from ..core.drafters import drafter_profiles
    from ..core.profile import profile_for, profile_path

    pair = pair_from_args(args)
    profile = profile_for(pair, refresh=args.refresh, progress=print_progress)
    print(f"cost profile ({profile.key.get('device_name')}, {profile.key.get('threads')} threads, "
          f"{profile.key.get('weights')} weights), cached at {profile_path(profile.key)}")
    print(f"verify(1) = {profile.verify(1):.1f} ms; drafter c = {profile.c:.3f} of it")
    print(" k  V(k)  s(k)  resume/full")
    for k in range(1, len(profile.verify_ms) + 1):
        print(f"{k:2d} {profile.V(k):5.2f} {profile.s(k):5.2f} {profile.resume(k) / profile.verify(k):6.2f}")
    for model, curve in profile.prompt_ms.items():
        print(f"{model} reads a prompt: " + ", ".join(f"{n} tokens {ms:.0f} ms" for n, ms in sorted(curve.items())))
    costs = drafter_profiles(pair, profile, args.exit_layer)
    print("each drafter's cost per token, c (of a one-token verifier pass): "
          + ", ".join(f"{name} {p.c:.3f}" for name, p in costs.items()))
    for alpha in (0.6, 0.7, 0.8, 0.9):
        rates = Rates(kept=alpha * 1000, trials=1000)
        line = []
        for name, p in costs.items():
            g = best_gamma(p, "sd", rates)
            line.append(f"{name} gamma {g}, ceiling {ceiling(p, alpha, g):.2f}")
        print(f"acceptance {alpha:.1f}, SD/AR: " + "; ".join(line))
    if args.write_prior:
        write_prior(args.write_prior, args.preset or "embedded", profile)
    return 0
