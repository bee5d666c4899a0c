"""Re-executing updates whose requests do not record their scoring layout (logs written before
``GradientRequested.scoring``): coevo scored "score" turns one request per row before
2026-12-01 and packed since, the two equal only to float32 rounding, so re-execution tries each
from the same weights and optimiser state and keeps the one that reproduces the recorded digest.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
import torch
from test_updates import TOKENIZER, request, score_turns, tiny_model

import agents.audit.reexecute as reexecute_module
from agents.audit.reexecute import Reexecution, UpdateInputs, requested_updates
from agents.events.policy import GradientRequested, PolicyUpdated
from agents.learning.learner import update_seed
from agents.learning.update import Sample, Trainee, grpo_step
from agents.models.policy import chosen_action_logps
from agents.models.tuning import torch_threads
from agents.testing.events import episode_finished, policy_updated
from engine.errors import UpdateDiverged
from engine.events import Envelope, Event
from stores.checkpoints import param_digest

CPU = torch.device("cpu")


def envelopes(updates: list[tuple[GradientRequested, str]]) -> list[Envelope[Event]]:
    """A log of one finished training episode per update, its request and its result."""
    model = tiny_model()
    events: list[Event] = []
    for k, (req, digest) in enumerate(updates):
        episode = f"ep{k}"
        turns = [msgspec.structs.replace(t, policy_version=k) for t in score_turns(model, episode)]
        events += turns
        events.append(
            episode_finished(
                episode, family="f", steps=3, score=1.0, success=True, total_reward=1.0
            )
        )
        events.append(msgspec.structs.replace(req, update=k, episodes=(episode,)))
        events.append(policy_updated(k + 1, samples=3, digest=digest, checkpoint="", seed=k))
    return [Envelope(seq=i, run="r", t=0, actor="a", event=e) for i, e in enumerate(events)]


def digests(layouts: list[str]) -> list[str]:
    """The digest after each update, run with ``layouts[k]``."""
    trainee = Trainee(tiny_model(), TOKENIZER, CPU, reference=False)
    out = []
    for k, layout in enumerate(layouts):
        turns = score_turns(tiny_model(), f"ep{k}")
        req = request(update=k, episodes=(f"ep{k}",), scoring=layout)
        grpo_step(trainee, [Sample(t, 1.0) for t in turns], req, seed=k, version=k)
        out.append(param_digest(trainee.model))
    return out


def reexecute(envs: list[Envelope[Event]]) -> Reexecution:
    trainee = Trainee(tiny_model(), TOKENIZER, CPU, reference=False)
    reexecution = Reexecution(Path("."), 0, trainee, None)
    reexecution.run(envs)
    return reexecution


def test_the_layouts_score_alike_but_not_bit_for_bit() -> None:
    model = tiny_model()
    turns = score_turns(model)
    args = ([t.prompt_ids for t in turns], [t.candidates for t in turns], [0, 0, 0])
    with torch.no_grad():
        rows = chosen_action_logps(
            model, *args, temperature=1.0, pad_id=0, device=CPU, layout="rows"
        )
        packed = chosen_action_logps(model, *args, temperature=1.0, pad_id=0, device=CPU)
    torch.testing.assert_close(rows, packed, rtol=1e-5, atol=1e-6)
    assert digests(["rows"]) != digests(["packed"])  # what makes re-execution choose
    with pytest.raises(ValueError, match="unknown scoring layout 'columns'"):
        chosen_action_logps(model, *args, temperature=1.0, pad_id=0, device=CPU, layout="columns")


def test_kept_trains_a_head_only_model_as_packed_did_bit_for_bit() -> None:
    """The embedded model's type is in ``HEAD_ONLY``: its runs' updates are the same whichever
    of the two layouts their requests name (only other models' differ)."""
    assert digests(["kept", "kept"]) == digests(["packed", "packed"])


@pytest.mark.parametrize("layouts", [["rows", "rows"], ["packed", "packed"], ["rows", "packed"]])
def test_requests_without_their_layout_re_execute_in_the_one_they_ran(
    layouts: list[str],
) -> None:
    """Written one way or the other (or resumed by newer code part-way), every update
    reproduces its digest."""
    unrecorded = [(request(), d) for d in digests(layouts)]
    assert reexecute(envelopes(unrecorded)).summary.policy == len(layouts)


def test_a_recorded_layout_is_the_only_one_tried() -> None:
    (rows,) = digests(["rows"])
    told = request(scoring="packed")
    with pytest.raises(UpdateDiverged, match=r"re-executed parameters have digest"):
        reexecute(envelopes([(told, rows)]))
    with pytest.raises(UpdateDiverged, match="names scoring 'columns'"):
        reexecute(envelopes([(request(scoring="columns"), rows)]))


def test_the_inputs_fold_pairs_each_update_with_its_request_and_samples() -> None:
    """``requested_updates`` yields what re-execution runs: the request, the turns the learner
    kept, the seed (derived from the run's for a log without ``PolicyUpdated.seed``) and the
    version trained; nothing is run."""
    log = envelopes([(request(scoring="packed"), "d0"), (request(scoring="packed"), "d1")])
    log[-1] = msgspec.structs.replace(
        log[-1], event=msgspec.structs.replace(log[-1].event, seed=None)
    )
    first, second = requested_updates(log, run_seed=7)
    assert (first.request.update, first.seed, first.version, len(first.samples)) == (0, 0, 0, 3)
    assert (second.seed, second.version, second.seq) == (update_seed(7, 1), 1, len(log) - 1)
    assert second.result is log[-1].event and second.stale == 0


def test_an_update_no_request_asked_for_or_no_policy_to_run_it_on_diverges() -> None:
    log = envelopes([(request(scoring="packed"), "d0")])
    inputs = UpdateInputs(run_seed=0)
    for env in log[:-2]:
        assert inputs.feed(env) is None
    with pytest.raises(UpdateDiverged, match="no GradientRequested before it"):
        inputs.feed(log[-1])  # its request skipped
    assert inputs.feed(log[-2]) is None and inputs.pending == 1
    rx = Reexecution(Path("."), 0, None, None)
    with pytest.raises(UpdateDiverged, match="no policy to re-execute it on"):
        rx.run(log)


def test_each_update_re_executes_with_the_torch_threads_it_recorded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``PolicyUpdated.threads`` (None in older logs: as the process has them) is the thread
    count each update runs with again; the process's own is restored afterwards."""
    threads = [None, 2, 1]
    trainee = Trainee(tiny_model(), TOKENIZER, CPU, reference=False)
    recorded = []
    for k, n in enumerate(threads):
        turns = score_turns(tiny_model(), f"ep{k}")
        req = request(update=k, episodes=(f"ep{k}",), scoring="packed")
        with torch_threads(n):
            grpo_step(trainee, [Sample(t, 1.0) for t in turns], req, seed=k, version=k)
        recorded.append((request(scoring="packed"), param_digest(trainee.model)))
    log = envelopes(recorded)
    for i, env in enumerate(log):
        if isinstance(env.event, PolicyUpdated):
            n = threads[env.event.update]
            log[i] = msgspec.structs.replace(
                env, event=msgspec.structs.replace(env.event, threads=n)
            )
    seen: list[int] = []

    def counting(*args: Any, **kwargs: Any) -> Any:
        seen.append(torch.get_num_threads())
        return grpo_step(*args, **kwargs)

    monkeypatch.setattr(reexecute_module, "grpo_step", counting)
    before = torch.get_num_threads()
    assert reexecute(log).summary.policy == 3
    assert seen == [before, 2, 1] and torch.get_num_threads() == before
