"""The receipt's keys written after it is made, each by one function here.

:func:`hcp_linux.run.receipt.build_receipt` makes a run's receipt from its plan (the layers,
the rung, the view, the protected names...). What is learnt later — which executor started
the run, the network's decisions, the denials, how and when the run ended, the driver's and
the server's sections — is written by the functions below and nowhere else, so that each key
has one writer and one place saying what it holds (docs/receipt.md says it for the user).
A test holds the package to it (tests/test_receipt_keys.py).

The receipt stays a plain dict (it is JSON, and the public API hands it out as one). Only
stdlib: the served client's light path writes ``end``, ``protected_sweep`` and ``exit``.
"""
from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing on the served path
if TYPE_CHECKING:
    from typing import Any, Mapping, Sequence

    Receipt = dict[str, Any]

__all__ = ["set_executor", "set_denial_layers", "set_denial_layer", "add_spawn_note",
           "set_egress", "set_denials", "set_protected_sweep", "set_end", "set_exit",
           "set_driver", "set_served_by", "set_policy_layers"]


def set_executor(receipt: Receipt, name: str) -> None:
    """``executor``: the executor that started the run ("native" or "ctypes")."""
    receipt["executor"] = name


def set_denial_layers(receipt: Receipt, layers: Mapping[str, str]) -> None:
    """``denial_layers``: per layer, whether its refusals are recorded (and why not)."""
    receipt["denial_layers"] = dict(layers)


def set_denial_layer(receipt: Receipt, layer: str, status: str) -> None:
    """One entry of ``denial_layers``, learnt at the end (a listener that stopped...)."""
    receipt.setdefault("denial_layers", {})[layer] = status


def denial_layer(receipt: Receipt, layer: str) -> str | None:
    """One entry of ``denial_layers`` as it stands."""
    layers = receipt.get("denial_layers") or {}
    return layers.get(layer)


def add_spawn_note(receipt: Receipt, note: str) -> None:
    """``spawn.notes``: what the spawn had to do besides the usual (a spare given up on)."""
    receipt.setdefault("spawn", {}).setdefault("notes", []).append(note)


def set_egress(receipt: Receipt, facts: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``network`` of a run with egress (network = "allow"): where the proxy, resolver
    and synthetic net are, the policy's egress rules; returns the ``decisions`` list the
    proxy appends each decision to while the run lasts."""
    decisions: list[dict[str, Any]] = []
    receipt.setdefault("network", {}).update(mode="allow", decisions=decisions, **facts)
    return decisions


def set_denials(receipt: Receipt, denials: Sequence[Mapping[str, Any]],
                dropped: Mapping[str, int]) -> None:
    """``denials`` (and ``denials_not_recorded``: per layer, the count past the cap)."""
    receipt["denials"] = list(denials)
    if dropped:
        receipt["denials_not_recorded"] = dict(dropped)


def set_protected_sweep(receipt: Receipt, done: Mapping[str, str]) -> None:
    """``protected_sweep``: what the after-run sweep did at each path (only when it did)."""
    if done:
        receipt["protected_sweep"] = dict(done)


def set_protected_pending(receipt: Receipt, why: str) -> None:
    """``protected_pending``: why the run's sweep was not written down for a later run to
    do should this runtime die during it (hcp_linux.policy.protected.pending): what the
    command makes at a missing protected name would then stay."""
    receipt["protected_pending"] = (f"not written ({why}): if this runtime dies during the "
                                    "run, what it made at a missing protected name stays")


#: ``end.notes``' note of a run that ended so (``end.by``): what happened, and what the
#: returncode then is.
END_NOTES = {
    "lost": "the sandbox's init ended without reporting the command's status: it or the "
            "sandbox's monitor was killed from outside the run (the OOM killer, an operator); "
            "the returncode is the monitor's, not the command's",
    "view-lost": "a hidden or read-only path of the view was replaced on the host during the "
                 "run, and the kernel took its mount away with the old file: the sandbox's "
                 "init killed the run at once (until then the command could reach what took "
                 "its place)",
}

#: The CLI's line for a run that ended so (``end.by``).
END_LINES = {
    "lost": "the sandbox was killed from outside the run (its init reported no status): the "
            "exit status is not the command's",
    "view-lost": "a hidden or read-only path was replaced on the host during the run, which "
                 "took its mount away: the sandbox was killed",
}


def set_end(receipt: Receipt, by: str, notes: Sequence[str] = ()) -> None:
    """``end``: who ended the run ("exit", "kill", "timeout"; "lost": killed from outside;
    "view-lost": killed by its init) and the teardown's notes, then what such an end means
    (:data:`END_NOTES`), when it needs saying."""
    said = [*notes, END_NOTES[by]] if by in END_NOTES else list(notes)
    end: dict[str, Any] = {"by": by}
    if said:
        end["notes"] = said
    receipt["end"] = end


def set_exit(receipt: Receipt, returncode: int | None, timed_out: bool,
             ended_by: str | None = None) -> None:
    """``exit``: the command's status as the CLI reports it, and the signal that ended
    the CLI itself when one did (``ended_by``)."""
    exit_: dict[str, Any] = {"returncode": returncode, "timed_out": timed_out}
    if ended_by is not None:
        exit_["ended_by"] = ended_by
    receipt["exit"] = exit_


def set_driver(receipt: Receipt, section: Mapping[str, Any]) -> None:
    """``driver``: the HCP driver's section (its name, mode, jail, pack, writeback)."""
    receipt["driver"] = dict(section)


def set_served_by(receipt: Receipt, pid: int, socket: str) -> None:
    """``served_by``: the `hcp-linux serve` process that planned the run."""
    receipt["served_by"] = {"pid": pid, "socket": socket}


def set_policy_layers(receipt: Receipt, layers: Sequence[str]) -> None:
    """``policy_layers``: what the CLI composed the run's policy of, bottom first (a preset,
    the system and user configs, the --policy file), when a preset or a config was in play.
    The CLI learns it, not the plan: a Policy is a value and does not remember its sources."""
    if layers:
        receipt["policy_layers"] = list(layers)
