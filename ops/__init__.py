"""Day-2 tools for a twinspark cluster, run from the operator's machine: python -m ops --help."""
