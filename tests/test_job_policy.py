"""A job class's keywords are typed (``JobPolicy``) and checked by name (issue 29): a
misspelt one is caught by mypy in the user's editor and, at run time, by a
``JobClassError`` naming it and the nearest valid keyword; a value of the wrong kind
names its keyword too, never pydantic's raw report."""

from __future__ import annotations

from typing import Any, get_type_hints

import pytest
from pydantic import BaseModel

from sqs_lease import App, JobClass, JobClassError, JobPolicy


class Work(BaseModel):
    n: int


def test_the_typed_keywords_are_the_job_class_fields_but_its_name_and_model() -> None:
    fields = set(JobClass.model_fields) - {"name", "payload_model"}
    assert set(get_type_hints(JobPolicy)) == fields


@pytest.mark.parametrize(
    ("declare", "where"),
    [
        (lambda app, kw: app.job("ocr", payload=Work, **kw), "job"),
        (lambda app, kw: app.staged("ocr", payload=Work, **kw), "staged"),
        (lambda app, kw: app.staged("ocr", payload=Work).stage("a", **kw), "stage"),
        (lambda app, kw: app.planned("ocr", **kw), "planned"),
        (lambda app, kw: app.planned("ocr").tool("t", args=Work, **kw), "tool"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_a_misspelt_keyword_is_named_with_the_nearest_one_wherever_a_class_is_declared(
    declare: Any, where: str
) -> None:
    with pytest.raises(
        JobClassError, match=r"'ocr': no keyword max_attempt=: did you mean max_attempts=\?"
    ):
        declare(App(), {"max_attempt": 3})
    with pytest.raises(
        JobClassError, match=r"no keyword frobnicate=: the keywords are: lease_seconds, "
    ):
        declare(App(), {"frobnicate": 1})


def test_a_value_of_the_wrong_kind_names_its_keyword_not_a_pydantic_report() -> None:
    with pytest.raises(JobClassError) as caught:
        App().job("ocr", payload=Work, max_attempts="three")  # type: ignore[arg-type]
    text = str(caught.value)
    assert text.startswith("job class 'ocr': max_attempts='three': ")
    assert "errors.pydantic.dev" not in text and "validation error" not in text
    with pytest.raises(JobClassError, match=r"max_attempts=0: Input should be greater than"):
        App().job("ocr", payload=Work, max_attempts=0)


def test_a_policy_dict_merges_with_more_keywords() -> None:
    roomy: JobPolicy = {"lease_seconds": 30, "heartbeat_seconds": 5.0}
    app = App()
    app.job("ocr", payload=Work, **roomy | {"max_attempts": 2})(lambda ctx, p: None)
    jc = app.classes["ocr"].job_class
    assert (jc.lease_seconds, jc.heartbeat_seconds, jc.max_attempts) == (30, 5.0, 2)
