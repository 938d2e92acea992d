"""`python -m via_sd setup`: assemble, verify and convert the embedded pair once; measure its costs here."""

from __future__ import annotations


def add_parser(sub) -> None:
    setup = sub.add_parser("setup", help="assemble, verify and convert the embedded pair once")
    setup.set_defaults(run=cmd_setup)


def cmd_setup(args) -> int:
    from ..embedded import embedded_model_dirs

    drafter_dir, verifier_dir = embedded_model_dirs()
    print(f"embedded pair ready:\n  drafter  {drafter_dir}\n  verifier {verifier_dir}")
    from ..lowbit import int4_available

    if int4_available():
        from .. import load_pair

        pair = load_pair("embedded", weights="int4")
        from ..profile import profile_for
        from .args import print_progress

        profile_for(pair, progress=print_progress)  # what a round costs here: gamma="auto" and predictions use it
        print("cost profile measured (python -m via_sd profile prints it)")
    return 0
