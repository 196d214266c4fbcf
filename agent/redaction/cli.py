"""`python main.py redact scan|show|approve EPISODE_ID`: the privacy review without the app.

    redact scan ID                 OCR the frames not scanned yet, find personal data in text
    redact show ID                 what will be blurred and masked, and who decided it
    redact approve ID --by NAME    write the blurred frames; the episode may then be submitted
               [--delete-originals | --keep-originals]   (default: the privacy.keep_originals setting)
               [--audio]           upload audio that has no transcript (else it stays on this machine)
"""
from __future__ import annotations

import sys

from agent.cli_common import open_store
from agent.redaction import RedactionError, review
from agent.redaction.plan import counts, plan_of
from agent.storage.store import NotFound


def register(sub, common) -> None:
    p = sub.add_parser("redact", parents=[common], help="find and redact personal data before upload")
    rs = p.add_subparsers(dest="redact_command", metavar="ACTION", required=True)
    for name, helptext in (("scan", "find personal data in an episode's screenshots and text"),
                           ("show", "list what will be blurred and masked"),
                           ("approve", "approve the redaction so the episode can be submitted")):
        q = rs.add_parser(name, parents=[common], help=helptext)
        q.add_argument("episode_id")
        if name == "approve":
            q.add_argument("--by", required=True, help="the reviewer's name, recorded with each decision")
            g = q.add_mutually_exclusive_group()
            g.add_argument("--delete-originals", dest="keep", action="store_false", default=None,
                           help="replace the local episode with the redacted one")
            g.add_argument("--keep-originals", dest="keep", action="store_true", help="keep the originals locally")
            q.add_argument("--audio", action="store_true", default=None,
                           help="approve audio that has no transcript for upload, as it is (you listened to it); "
                                "without this flag such audio is left out of uploads and exports")
        q.set_defaults(func=cmd_redact)


def cmd_redact(args) -> int:
    store = open_store(args)
    try:
        if args.redact_command == "scan":
            def progress(done, total, text=""):
                print(f"\r{text or f'{done}/{total}'}", end="", file=sys.stderr, flush=True)

            plan = review.scan(store, args.episode_id, progress=progress)
            print(file=sys.stderr)
            c = counts(plan)
            print(f"{c['boxes']} regions to blur on {c['frames']} frames, {c['spans']} text spans to mask")
        elif args.redact_command == "show":
            ep = store.load_episode(args.episode_id)
            plan = plan_of(ep)
            if plan is None:
                print(f"episode {args.episode_id} has not been scanned: run `redact scan {args.episode_id}`")
                return 1
            print(f"status: {plan['status']}" + (f" by {plan['approved_by']}" if plan["approved_by"] else ""))
            for s in ep.steps:
                for which, h in (("screenshot", s.observation.screenshot), ("after", s.observation.post_screenshot)):
                    for b in (plan["frames"].get(h) or {}).get("boxes", []):
                        x0, y0, x1, y1 = b["rect"]
                        print(f"step {s.index + 1} {which}: {'blur' if b['blur'] else 'keep'} {b['kind']} at "
                              f"({x0:.3f}, {y0:.3f})-({x1:.3f}, {y1:.3f}) found by {b['by']}, decided by {b['decided_by']}")
            for key, e in plan["texts"].items():
                for sp in e["spans"]:
                    print(f"{key}: {'mask' if sp['blur'] else 'keep'} {sp['kind']} at {sp['start']}..{sp['end']} "
                          f"found by {sp['by']}, decided by {sp['decided_by']}")
        else:
            plan = review.approve(store, args.episode_id, args.by, keep_originals=args.keep, audio=args.audio)
            c = counts(plan)
            print(f"approved: {c['boxes']} regions blurred on {c['frames']} frames, {c['spans']} text spans masked")
            if review.untranscribed_audio(store.load_episode(args.episode_id)):
                print("its audio has no transcript: " + ("approved by you, it is uploaded as it is" if plan.get("audio")
                      else "it stays on this machine (approve it as audio with --audio)"))
    except (RedactionError, NotFound) as e:
        print(f"redact: {e}", file=sys.stderr)
        return 1
    finally:
        store.close()
    return 0
