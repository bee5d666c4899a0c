"""What plug-in authors test event streams with (docs/TESTING.md): well-formed streams drawn by
Hypothesis (:mod:`agents.testing.streams`, the ``testing`` extra) and edits of a stream for
negative controls (:mod:`agents.testing.edits`, no Hypothesis needed), and single events with
neutral contents (:mod:`agents.testing.events`); which processes run
(:mod:`agents.testing.processes`, Linux); a tiny random Qwen2 model for tests that run one
(:mod:`agents.testing.models`)."""
