"""Multi-head self-attention over 2-D pixel grids with the paper's positional scores."""
