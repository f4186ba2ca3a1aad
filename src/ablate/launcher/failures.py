"""Which rank failed first, and why: of the errors a failed job's ranks report, the one a rank raised itself
is the root cause; a rank that only lost its peer (gloo's "Connection closed by peer"), was killed by a
signal or ended before reporting is a consequence. Used for local ranks (torch elastic's failures) and for
Slurm tasks (submitit's)."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

PEER_GONE = ("Connection closed by peer", "Connection reset", "remote worker crash")   # it blames a peer
KILLED = ("SIGTERM", "Signals.")
CONSEQUENCES = PEER_GONE + KILLED


def is_consequence(message: str) -> bool:
    """An error that only says a peer went away: another rank's failure is the root cause."""
    return any(c in message for c in CONSEQUENCES)


def blames_a_peer(message: str) -> bool:
    return any(c in message for c in PEER_GONE)


# lines of a C++ error's captured stack ("default_hooks.py(31): <lambda>", "frame #3: ..."), not its message
STACK_LINE = re.compile(r"\.py\(\d+\): |^frame #\d+|^Exception raised from |^\s*File \"")


def _message(failure):
    """(the error file's message as text, where it was raised) of a failed rank."""
    message, where = failure.message, ""
    if isinstance(message, dict):
        stack = str((message.get("extraInfo") or {}).get("py_callstack", ""))
        frames = [ln.strip() for ln in stack.splitlines() if ln.strip().startswith("File ")]
        where = frames[-1] if frames else ""
        message = message.get("message", message)
    return str(message), where


def own_error(failure) -> str:
    """The failing rank's own exception (torch elastic's error file), with where it was raised when its
    text alone says nothing (a bare `AssertionError:`). A C++ error's message comes before its stack."""
    message, where = _message(failure)
    lines = [ln for ln in message.strip().splitlines() if ln.strip()]
    said = [ln for ln in lines if not STACK_LINE.search(ln)]
    text = (said[0] if len(said) < len(lines) else said[-1]) if said else \
        (lines[-1] if lines else f"exit code {failure.exitcode}")
    if text.startswith("To enable traceback"):   # no error file: the rank died outside Python's handler
        text = f"the process ended with exit code {failure.exitcode} before reporting an error"
    if text.rstrip().endswith(":") and where:
        text = f"{text.rstrip(': ')} at {where}"
    return text


def root_cause_first(failures):
    """Earliest first (timestamps are whole seconds), and among equals the rank whose error is not just
    the consequence of a peer going away (judged on the whole message, not only the line shown)."""
    def key(kv):   # a rank killed by a signal or an abort (no Python exception of its own) is a consequence;
        # one whose error says a peer went away comes last of all: that peer, even killed, is nearer the cause
        failure, message = kv[1], own_error(kv[1])
        whole = _message(failure)[0]
        blames = blames_a_peer(message) or blames_a_peer(whole)
        consequence = (failure.exitcode < 0 or message.startswith("the process ended")
                       or is_consequence(message) or is_consequence(whole))
        return blames, consequence, failure.timestamp, kv[0]

    return sorted(failures.items(), key=key)


def noted_root_cause(folder):
    """(rank, error) from the ranks' own notes (train/trainer.py writes <run dir>/.failures/rank{N}.txt the
    moment a rank fails, before its peers lose the connection): the first that is not only a consequence.
    torch elastic may stop a rank before it reports; its note is still there."""
    notes = sorted(Path(folder).glob("rank*.txt"), key=lambda p: p.stat().st_mtime) if Path(folder).is_dir() else []
    texts = [(int(p.stem[4:]), p.read_text().strip()) for p in notes]
    own = [(rank, text.splitlines()[0]) for rank, text in texts if text]
    return next(((rank, text) for rank, text in own if not is_consequence(text)), None)


def silent_ranks(folder, world: int):
    """Ranks that left no note at all (no error, no stop, no signal's stop): killed outright (kill -9, the OOM
    killer), they could say nothing, and the others' "connection closed by peer" is about them."""
    folder = Path(folder)
    noted = {int(m.group(1)) for p in (folder.glob("*rank*.txt") if folder.is_dir() else [])
             for m in [re.search(r"rank(\d+)\.txt$", p.name)] if m}
    return [r for r in range(world) if r not in noted]


def noted_stop(folder):
    """(rank, why) of a rank that stopped the run on purpose (a full disk, non-finite training: RunStopped,
    noted by train/trainer.py as stopped-rank{N}.txt), the lowest rank first; None when none did."""
    notes = sorted(Path(folder).glob("stopped-rank*.txt"), key=lambda p: int(p.stem[len("stopped-rank"):])) \
        if Path(folder).is_dir() else []
    return next(((int(p.stem[len("stopped-rank"):]), first_line(p.read_text())) for p in notes), None)


def first_line(text: str) -> str:
    """A note's message: its first line (a traceback, when there is one, follows a blank line)."""
    return text.strip().splitlines()[0] if text.strip() else ""


# the console's line stays short: a long error (DTensor's specs, a C++ stack) is cut, its whole text in the note
SHOWN_CHARS = 150


def shown(message: str, note: Optional[Path] = None, cut: bool = True) -> str:
    """A rank's error as the console's one line shows it: its first line, cut at SHOWN_CHARS (an error's text;
    `cut=False`: ablate's own stop, one line already), and where the whole error and its traceback are (the rank's
    note in the run dir), when there is one."""
    text = first_line(message) or message
    text = text if len(text) <= SHOWN_CHARS or not cut else text[:SHOWN_CHARS].rstrip() + "..."
    traced = note is not None and note.exists() and len(note.read_text().strip().splitlines()) > 1
    return f"{text} (traceback: {note})" if traced else text
