"""Live experiment tracking: the scalars a run's events fold to (:mod:`.scalars`), the sinks
that write them (TensorBoard, Weights & Biases offline, MLflow's file store: :mod:`.sinks`), and
the observer actor that writes them while the run goes on (:mod:`.actor`)."""
