"""What several studies share: the result-file writer (``report``)."""
