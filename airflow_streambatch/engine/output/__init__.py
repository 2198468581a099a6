"""The output layer: an output path opened for writing (`target.OutputTarget`), its write
lease (`lease.py`), and the commit protocol its filesystem needs (`protocols.py`)."""
