"""What a resume needs from checkpoints: the optimiser's state round-trips through
safetensors bit for bit, and pruning keeps every version the log may still name."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from stores.checkpoints import DirCheckpoints, optimizer_tensors, restore_optimizer


class _Tokenizer:
    def save_pretrained(self, path: Path) -> None:
        (Path(path) / "tokenizer.json").write_text("{}")


class _Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(3, 2)
        self.b = torch.nn.Linear(2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x))

    def save_pretrained(self, path: Path, *, safe_serialization: bool = True) -> None:
        assert safe_serialization, "checkpoints are safetensors only"
        from safetensors.torch import save_file

        Path(path).mkdir(parents=True, exist_ok=True)
        save_file(dict(self.state_dict()), str(Path(path) / "model.safetensors"))


def _steps(model: _Model, opt: torch.optim.Optimizer, n: int) -> None:
    gen = torch.Generator().manual_seed(0)
    for _ in range(n):
        opt.zero_grad()
        model(torch.randn(4, 3, generator=gen)).sum().backward()
        opt.step()


def test_optimizer_state_round_trips_and_training_continues_identically(tmp_path: Path) -> None:
    torch.manual_seed(1)
    model = _Model()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    _steps(model, opt, 3)
    store = DirCheckpoints(tmp_path / "checkpoints", keep=1)
    name = store.save(1, model, _Tokenizer(), optimizer_tensors(model, opt))
    saved = store.load_optimizer(name)
    assert saved is not None and not list((tmp_path / "checkpoints").glob("*.pkl"))

    again = _Model()
    again.load_state_dict(store.load(name))
    opt2 = torch.optim.AdamW(again.parameters(), lr=0.01)
    restore_optimizer(again, opt2, saved)
    _steps(model, opt, 2)
    _steps(again, opt2, 2)
    for (n1, p1), (n2, p2) in zip(
        model.state_dict().items(), again.state_dict().items(), strict=True
    ):
        assert n1 == n2 and torch.equal(p1, p2), n1


def test_a_checkpoint_the_disk_refuses_is_named_with_the_likely_cause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under ``ulimit -f`` a run failed with safetensors' "SafetensorError: Error while
    serializing: I/O error: File too large (os error 27)", naming neither the checkpoint nor
    the limit."""
    import safetensors
    import safetensors.torch

    from engine.errors import CheckpointNotWritten

    def too_large(*args: object, **kwargs: object) -> None:
        raise safetensors.SafetensorError(
            "Error while serializing: I/O error: File too large (os error 27)"
        )

    monkeypatch.setattr(safetensors.torch, "save_file", too_large)
    model = _Model()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    _steps(model, opt, 1)
    store = DirCheckpoints(tmp_path / "checkpoints", keep=1)
    with pytest.raises(CheckpointNotWritten) as err:
        store.save(1, model, _Tokenizer(), optimizer_tensors(model, opt))
    said = str(err.value)
    assert said.startswith(f"cannot write the checkpoint {tmp_path}/checkpoints/.v000001.partial")
    assert "(a file-size limit: ulimit -f?)" in said and "coevo resume continues" in said
    assert not (tmp_path / "checkpoints" / "v000001").exists()


def test_pruning_keeps_every_version_from_protect_from(tmp_path: Path) -> None:
    store = DirCheckpoints(tmp_path / "checkpoints", keep=1)
    model = _Model()
    store.save(1, model, _Tokenizer(), protect_from=1)
    store.save(2, model, _Tokenizer(), protect_from=1)  # the log may name only version 1 yet
    store.save(3, model, _Tokenizer(), protect_from=2)
    kept = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert kept == ["v000002", "v000003"]
    store.save(4, model, _Tokenizer())  # no protection: the newest `keep` only
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["v000004"]


def test_a_checkpoint_is_not_written_after_the_run_directory_moved(tmp_path: Path) -> None:
    """A run directory renamed mid-run: the learner's next save created the old path anew,
    holding only checkpoints/, and the log (which moved) named checkpoints it did not have."""
    import pytest

    from engine.errors import RunDirectoryMoved

    run = tmp_path / "run"
    run.mkdir()
    store = DirCheckpoints(run / "checkpoints")
    run.rename(tmp_path / "moved")
    with pytest.raises(RunDirectoryMoved, match="was moved, deleted or replaced"):
        store.save(1, object(), object())
    assert not run.exists()
    run.mkdir()  # another directory at the old path: still not the run's
    with pytest.raises(RunDirectoryMoved):
        store.save(1, object(), object())
    assert list(run.iterdir()) == []
