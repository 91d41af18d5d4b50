"""When `TopicAdmin.create` takes a topic as ready: in a node's metadata answer, the topic
known without error, with the partitions asked for (or more), each with a leader."""

from __future__ import annotations

from decaton_aio.admin import _all_led


def _topic(name: str, leaders: list[int], error_code: int = 0) -> dict[str, object]:
    partitions = [{"partition": p, "leader": leader} for p, leader in enumerate(leaders)]
    return {"topic": name, "error_code": error_code, "partitions": partitions}


def test_a_topic_is_ready_when_each_of_its_partitions_has_a_leader() -> None:
    assert _all_led([_topic("t", [1, 2, 3])], {"t": 3}) == {"t"}


def test_a_partition_without_a_leader_keeps_its_topic_waiting() -> None:
    assert _all_led([_topic("t", [1, -1, 3])], {"t": 3}) == set()


def test_a_node_that_does_not_know_the_topic_keeps_it_waiting() -> None:
    unknown = _topic("t", [], error_code=3)  # UNKNOWN_TOPIC_OR_PARTITION
    assert _all_led([unknown], {"t": 3}) == set()


def test_fewer_partitions_than_created_keep_the_topic_waiting() -> None:
    assert _all_led([_topic("t", [1, 2]), _topic("u", [1])], {"t": 3, "u": 1}) == {"u"}


def test_a_topic_taken_as_it_is_waits_for_every_partition_it_has() -> None:
    """An existing topic is asked for with one partition: any count is ready once all of
    its partitions are led, and a topic listed without partitions is not."""
    assert _all_led([_topic("t", [1])], {"t": 1}) == {"t"}
    assert _all_led([_topic("t", [1, -1])], {"t": 1}) == set()
    assert _all_led([_topic("t", [])], {"t": 0}) == set()
