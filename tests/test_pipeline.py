"""Pipeline naming and stage reuse rules (the full run is in test_e2e_default.py)."""

from qserve.pipeline import _run_name


def test_run_dir_names():
    assert _run_name("default", "default") == "minilm-l6-distilbert-imdb"
    assert _run_name("default", "rotten-tomatoes") == "minilm-l6-distilbert-rotten-tomatoes"
    assert _run_name("distilbert-base-uncased", "imdb") == "distilbert-base-uncased-imdb"
    assert _run_name("default", "/data/reviews.csv") == "minilm-l6-distilbert-reviews"
