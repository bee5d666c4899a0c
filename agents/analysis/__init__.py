"""Reading runs for analysis: a run's events as Arrow tables and pandas or polars data frames
(:mod:`.frames`), and two runs compared (:mod:`.diff`)."""
