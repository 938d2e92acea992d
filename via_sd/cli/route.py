"""`python -m via_sd route`: search, measure or report slim-verifier routes (code: via_sd/route_search/)."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from ..weights.embedded import EMBEDDED_VERIFIER
from ..core.pair import PRESETS
from ..route_search import (BASELINE_DIR, OBJECTIVES, TeacherForced, calibration_from_file, check_ratio, default_texts,
                            measure_route, one_at_a_time_route, rank_one_at_a_time, saved_routes, search_curve,
                            skip_count)
from ..core.routing import ROUTES_DIR, Route, shipped_routes
from .args import add_pair_arguments, pair_from_args, print_progress


def _method(data: dict) -> str:
    method = data.get("method", "")
    return data.get("search", {}).get("objective") or next(
        (word for word in ("one-at-a-time", "provisional") if method.startswith(word)), "other")


def _row(name: str, data: dict) -> str:
    cost, weights = data.get("cost", {}), data.get("weights", {})
    cal, held = data.get("calibration", {}), data.get("held_out", {})
    mlp = sum(s.startswith("mlp") for s in data["skip"])

    def num(d: dict, key: str) -> str:
        return f"{d[key]:.3f}" if isinstance(d.get(key), (int, float)) else "-"

    return (f"{name:<36} {_method(data):<13} {len(data['skip']):>3} {mlp:>3} {data.get('skip_fraction', 0):>5.2f} "
            f"{num(weights, 'read'):>5} {num(cost.get('one_token', {}), 'ratio'):>5} "
            f"{num(cost.get('verify_step', {}), 'ratio'):>6} {num(cal, 'top1_agreement'):>7} {num(cal, 'kl'):>6} "
            f"{num(held, 'top1_agreement'):>8} {num(held, 'kl'):>7}")


HEADER = (f"{'route':<36} {'method':<13} {'skp':>3} {'mlp':>3} {'ratio':>5} {'read':>5} {'cost1':>5} {'cost_v':>6} "
          f"{'cal_agr':>7} {'cal_kl':>6} {'held_agr':>8} {'held_kl':>7}")
LEGEND = ("skp / mlp: sub-layers skipped / of them MLPs; ratio: skipped share of sub-layers; read: share of the "
          "weights a slim forward reads; cost1 / cost_v: measured slim / full forward time for 1 token / gamma+1 "
          "tokens; cal / held: top-1 agreement and KL against the full verifier on calibration / held-out text")


def _verifier_name(args) -> str | None:
    source = args.verifier or PRESETS.get(args.preset or ("embedded" if not args.drafter else ""), {}).get("verifier")
    names = {"embedded:verifier": f"{EMBEDDED_VERIFIER} (embedded)", "random:verifier": "random-llama-4L"}
    return names.get(source, source)


def cmd_report(args) -> int:
    """Prints the agreement-versus-cost curve of every saved route for the pair (no model is loaded)."""
    name = _verifier_name(args)
    rows = [(p, d) for p, d in saved_routes()
            if not name or isinstance(d.get("model"), dict) and d["model"].get("verifier") == name]
    if not rows:
        print(f"no saved routes for {name}; make some with `python -m via_sd route --skip-ratio R --out FILE`")
        return 1
    # one curve per method, cheapest last: agreement falls as the cost does
    rows.sort(key=lambda pd: (_method(pd[1]), -pd[1].get("weights", {}).get("read", 1.0), pd[0].stem))
    print(f"agreement versus cost of the saved routes for {name}")
    print(HEADER)
    for path, data in rows:
        label = path.stem if path.parent == ROUTES_DIR else f"{path.parent.name}/{path.stem}"
        print(_row(label, data))
    devices = sorted({d.get("cost", {}).get("device") for _, d in rows} - {None})
    print(LEGEND)
    if devices:
        print("costs measured on: " + "; ".join(devices))
    return 0


def cmd_route(args) -> int:
    if args.report:
        return cmd_report(args)
    ratios = [float(r) for r in args.curve.split(",")] if args.curve else [args.skip_ratio]
    for r in ratios:
        check_ratio(r)  # fails before minutes of model loading
    pair = pair_from_args(args)
    n = pair.verifier.config.num_hidden_layers
    for r in ratios:
        skip_count(n, r)

    progress = print_progress
    calibration = held_out = None
    if args.calibration:
        calibration = calibration_from_file(pair, args.calibration, progress)
    if args.held_out:
        held_out = calibration_from_file(pair, args.held_out, progress)
    if calibration is None or held_out is None:
        default_calibration, default_held_out = default_texts(pair, progress)
        calibration, held_out = calibration or default_calibration, held_out or default_held_out
    progress(f"calibration: {calibration.scored_tokens} scored tokens in {len(calibration.sequences)} sequences; "
             f"held-out: {held_out.scored_tokens}", 0.0)
    cal_tf = TeacherForced(pair.verifier, calibration)
    held_tf = TeacherForced(pair.verifier, held_out)
    measure = dict(gamma=args.gamma, kv_length=args.kv_length, repeats=args.repeats, cost=not args.no_cost)

    def write(route: Route, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(route.to_json() + "\n", encoding="utf-8")
        print(_row(route.name, route.to_dict()), flush=True)
        progress(f"wrote {path}", 1.0)

    print(HEADER)
    if args.measure:  # re-measure an existing route (e.g. a hand-written one) and write it with numbers
        route = measure_route(pair, args.measure, {"calibration": cal_tf, "held_out": held_tf}, **measure)
        write(route, Path(args.out) if args.out else shipped_routes().get(args.measure, Path(args.measure)))
        return 0
    if args.baseline:
        ranking = rank_one_at_a_time(pair, cal_tf, progress)
        for r in ratios:
            route = one_at_a_time_route(pair, ranking, r, name=f"{args.prefix}-one-at-a-time-s{round(100 * r):02d}")
            route = measure_route(pair, route, {"calibration": cal_tf, "held_out": held_tf}, **measure)
            write(route, Path(args.out_dir or BASELINE_DIR) / f"{route.name}.json")
        return 0
    ratios = sorted(ratios)
    single = args.out and not args.curve
    names = [Path(args.out).stem] if single else [f"{args.prefix}-s{round(100 * r):02d}" for r in ratios]
    routes = search_curve(pair, ratios, cal_tf, start=args.start, objective=args.objective,
                          candidates=args.candidates, swaps=args.swaps, names=names, progress=progress)
    for route in routes:
        path = Path(args.out) if single else Path(args.out_dir or ROUTES_DIR) / f"{route.name}.json"
        if route.meta["search"]["stopped"]:
            write(route, path)
            progress("stopped early: the route above has fewer sub-layers than asked and no held-out numbers", 1.0)
            return 130
        route = measure_route(pair, route, {"held_out": held_tf}, **measure)
        made = {"by": "python -m via_sd route", "date": datetime.now(timezone.utc).strftime("%Y-%m-%d")}
        write(Route(route.name, route.skip, n, {**route.meta, "made": made}), path)
    return 0


def add_parser(sub) -> None:
    parser = sub.add_parser("route", help="search, measure or report slim-verifier routes",
                            description="Search (without training) which sub-layers the slim verifier skips, "
                                        "measure routes, or print the agreement-versus-cost curve.")
    add_pair_arguments(parser)
    parser.add_argument("--skip-ratio", type=float, default=0.45, help="share of sub-layers to skip, in [0, 0.9]")
    parser.add_argument("--out", help="route file to write (default assets/routes/PREFIX-sNN.json)")
    parser.add_argument("--curve", help="several ratios, e.g. 0.1,0.2,0.3,0.45: one search passes through all, "
                                        "one file each in --out-dir")
    parser.add_argument("--out-dir", help="folder for --curve / --baseline files (default assets/routes)")
    parser.add_argument("--prefix", default="custom", help="file name prefix for --curve / --baseline routes")
    parser.add_argument("--from", dest="start", help="continue the search from this smaller route")
    parser.add_argument("--calibration", help="calibration text: prompts .jsonl (continued by the full verifier), "
                                              "a calibration .json, or a plain text file")
    parser.add_argument("--held-out", help="held-out text to report agreement on (same formats; default: "
                                           "continuations of other task prompts)")
    parser.add_argument("--objective", choices=list(OBJECTIVES), default="kl",
                        help="kl: closest to the full verifier; kl-per-cost: least KL added per weight saved")
    parser.add_argument("--candidates", type=int, default=4, help="exactly measured candidates per greedy step")
    parser.add_argument("--swaps", type=int, default=8, help="evaluations for the final local swaps")
    parser.add_argument("--report", action="store_true", help="print the agreement-vs-cost curve of saved routes")
    parser.add_argument("--baseline", action="store_true", help="write one-at-a-time baseline routes instead")
    parser.add_argument("--measure", help="measure this route (name or file) and write it with its numbers")
    parser.add_argument("--gamma", type=int, default=5, help="draft length for the gamma+1-token cost")
    parser.add_argument("--kv-length", type=int, default=256, help="KV cache length for the cost measurement")
    parser.add_argument("--repeats", type=int, default=9, help="timing repeats (interleaved slim/full)")
    parser.add_argument("--no-cost", action="store_true", help="skip the timing measurement")
    parser.set_defaults(run=cmd_route)
