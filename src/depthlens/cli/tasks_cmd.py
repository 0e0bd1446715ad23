"""``depthlens tasks``: the task names ``--task`` accepts, and each family's answer type."""

from __future__ import annotations

from depthlens.cli.app import app, console


@app.command("tasks")
def tasks() -> None:
    """List the task names `generate --task` and `thinkn --task` accept."""
    from depthlens.evals.loading import reasoning_gym_names
    from depthlens.evals.tasks import ANSWER_TYPES, HUB_TASKS

    console.print("[bold]hub benchmarks[/] (need the hub, or --data FILE.jsonl): " + ", ".join(HUB_TASKS))
    console.print("[bold]reasoning-gym[/] (offline, generated; use reasoning_gym:<name>):")
    console.print(", ".join(reasoning_gym_names()), soft_wrap=True)
    console.print(
        "[bold]answer types[/] (others inferred from the reference answers; --answer-type overrides):"
    )
    by_type: dict[str, list[str]] = {}
    for family, kind in ANSWER_TYPES.items():
        by_type.setdefault(kind, []).append(family)
    for answer_type, families in by_type.items():
        console.print(f"  {answer_type}: {', '.join(families)}", soft_wrap=True)
    console.print("[bold]local[/]: any .jsonl with question, answer and optional choices per line")
