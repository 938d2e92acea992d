"""`python -m via_sd setup`: assemble, verify and convert the embedded pair once; measure its costs here."""

from __future__ import annotations


def add_parser(sub) -> None:
    setup = sub.add_parser("setup", help="assemble, verify and convert the embedded pair once")
    setup.set_defaults(run=cmd_setup)


SETUP_RECORD = "setup.json"  # what the set-up left in the cache (the test session starts from it, nothing else)


def record_setup(profile) -> None:
    """Names the profile the set-up measured, so a test session can start from exactly the set-up's cache."""
    import json

    from ..weights.paths import cache_root

    (cache_root() / SETUP_RECORD).write_text(json.dumps({"profiles": [profile.name]}) + "\n")
    (cache_root() / "lowbit-kernels.json").unlink(missing_ok=True)  # an older version's timed kernel table


def report_kernel() -> None:
    """Builds the low-bit kernel here once (a C++ extension) and says which kernel runs, or why torch's do."""
    from ..weights.linears import kernel_rule
    from ..weights.lowbit_kernel import build_error

    print(f"low-bit kernel: {kernel_rule()}")
    if build_error():
        print("  the compiler's full output is logged above; fix its first error and run the set-up again")


def cmd_setup(args) -> int:
    from ..weights.embedded import embedded_model_dirs

    drafter_dir, verifier_dir = embedded_model_dirs()
    print(f"embedded pair ready:\n  drafter  {drafter_dir}\n  verifier {verifier_dir}")
    report_kernel()
    from ..weights.settings import int4_available

    if int4_available():
        from .. import load_pair

        pair = load_pair("embedded", weights="int4")
        from ..core.profile import profile_for, profile_path
        from .args import print_progress

        profile = profile_for(pair, progress=print_progress)  # what a round costs here: gamma="auto" uses it
        record_setup(profile_path(profile.key))
        print("cost profile measured (python -m via_sd profile prints it)")
    return 0
