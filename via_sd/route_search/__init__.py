"""Route search: which sub-layers the slim verifier skips, found without training.

Goal. For a skip ratio r, find round(r * 2L) sub-layers ("attn.N" / "mlp.N", never in the first or
last layer) whose removal keeps the slim verifier closest to the full verifier on calibration
text: continuations the full verifier generated itself from task prompts, teacher-forced, scored
only on the continuation. Closeness is the mean KL(full || slim) of the next-token distributions;
top-1 agreement is reported beside it (KL is smooth, so it separates candidates that agreement
would tie on a few hundred tokens).

The search, and why this one. Exhaustive search is out of reach (C(52, 25) routes for a 28-layer
verifier), and Bayesian optimisation over subsets needs hundreds of full evaluations before its
surrogate models the interactions between skips. Ranking sub-layers one at a time ignores those
interactions (skips that are harmless alone hurt together). Greedy elimination measures each step
with the earlier skips in place, so it sees interactions, but a plain greedy step measures every
remaining sub-layer: O(L^2) teacher-forced passes, hours on a CPU. We keep the greedy choice and
cut its cost three ways:

1. Lazy greedy (Minoux): every sub-layer is measured once, skipped alone on top of the start route
   (that is the one-at-a-time ranking); each step then re-measures only the sub-layers with the
   smallest stale harm, at most `candidates` of them, and stops early once the best fresh harm is
   no larger than the next stale one (harms mostly grow as more is skipped, so a stale harm is an
   optimistic bound). Screening by block influence 1 - cos(h, h + f(h)) (ShortGPT) was tried first
   and discarded: on the embedded 1.5B it screened out the sub-layers that hurt least.
2. Shared prefix: a candidate at sub-layer k changes nothing before k, so its pass starts from the
   recorded hidden state entering k; the winner's recorded states become the next step's.
3. Local swaps: at each target ratio, swap a skipped sub-layer for a kept one of the same kind
   (attention for attention, MLP for MLP, so the cost stays put) while that lowers the KL.

Objectives: "kl" skips what raises KL least; "kl-per-cost" what raises it least per share of the
weights saved (an MLP of a Qwen-style layer holds 7x the weights of its attention, so the pure KL
objective fills low ratios with cheap-to-skip attention that saves little time).
One greedy run passes through every smaller ratio, so a whole curve (`search_curve`, `--curve`)
costs about one search to its largest ratio.

Where things are: sublayers (names, ratios, weight shares), calibrate (texts), teacher (the
teacher-forced pass: the slim verifier's own forward, routing.SlimVerifier.run), search, cost (timings,
measured routes), cache (saved routes), resolve (a route for a pair loaded without one; `pick_route`
never searches). The command line is via_sd/cli/route.py.

The files this writes (assets/routes/NAME.json) carry the model, the skipped sub-layers, the
calibration and held-out agreement and KL, the measured cost of a slim forward relative to a full
one (one token and a gamma+1-token verification step, on the named device) and how it was made.
"""

from .cache import BASELINE_DIR, model_identity, route_cache_dir, saved_routes
from .calibrate import (CALIBRATION_DIR, CALIBRATION_PROMPTS, CALIBRATION_TOKENS, HELD_OUT_PROMPTS, HELD_OUT_TOKENS,
                        PROMPTS_DIR, Calibration, calibration_from_file, default_texts, generate_calibration,
                        task_prompts, text_calibration)
from .cost import device_name, measure_cost, measure_route
from .resolve import default_search, how_made, pick_route, route_for, saved_route
from .search import METHOD, OBJECTIVES, one_at_a_time_route, rank_one_at_a_time, search_curve, search_route
from .sublayers import (MAX_RATIO, check_ratio, skip_count, skippable, sublayer_index, sublayer_name, sublayer_sizes,
                        weight_share)
from .teacher import Pass, TeacherForced

__all__ = ["BASELINE_DIR", "CALIBRATION_DIR", "CALIBRATION_PROMPTS", "CALIBRATION_TOKENS", "HELD_OUT_PROMPTS",
           "HELD_OUT_TOKENS", "MAX_RATIO", "METHOD", "OBJECTIVES", "PROMPTS_DIR", "Calibration", "Pass",
           "TeacherForced", "calibration_from_file", "check_ratio", "default_search", "default_texts", "device_name",
           "generate_calibration", "how_made", "measure_cost", "measure_route", "model_identity",
           "one_at_a_time_route", "pick_route", "rank_one_at_a_time", "route_cache_dir", "route_for", "saved_route",
           "saved_routes", "search_curve", "search_route", "skip_count", "skippable", "sublayer_index",
           "sublayer_name", "sublayer_sizes", "task_prompts", "text_calibration", "weight_share"]
