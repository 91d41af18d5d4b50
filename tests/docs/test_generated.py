"""The generated reference pages are what the code says today: the command line, the
runtime properties, the environment variables and the metrics. A change to the code that
the committed pages miss fails here; ``python -m docs.gen`` writes them again."""

from __future__ import annotations

import pytest

from docs import gen


@pytest.mark.parametrize("page", sorted(gen.PAGES))
def test_committed_page_matches_the_code(page: str) -> None:
    """Given the committed page, when the code renders it again, then nothing differs."""
    committed = (gen.REFERENCE / page).read_text()
    assert committed == gen.PAGES[page](), (
        f"docs/reference/{page} is stale: run python -m docs.gen and commit it"
    )


def test_a_drifted_page_is_reported(tmp_path) -> None:
    """A page that differs from the code, or is missing, is named by the check."""
    for name, render in gen.PAGES.items():
        (tmp_path / name).write_text(render())
    (tmp_path / "metrics.md").write_text("| `decaton_old_metric` | counter |\n")
    (tmp_path / "cli.md").unlink()
    assert gen.stale_pages(tmp_path) == ["cli.md", "metrics.md"]


def test_every_reference_names_what_it_documents() -> None:
    """Each page carries the entries of its source, not an empty table."""
    from decaton_aio import environment
    from decaton_aio.properties import BUILTIN_DEFINITIONS

    assert all(f"`{d.name}`" in gen.render_properties() for d in BUILTIN_DEFINITIONS)
    assert all(f"`{v.name}`" in gen.render_environment() for v in environment.VARIABLES)
    metrics = gen.render_metrics()
    for name in (
        "decaton_consumer_lag",
        "decaton_state_standby",
        "decaton_supervisor_worker_restarts_total",
    ):
        assert f"`{name}`" in metrics
    cli = gen.render_cli()
    assert all(f"## `{command}`" in cli for command in ("broker", "produce", "inspect", "run"))
    assert "`--exactly-once`" in cli
