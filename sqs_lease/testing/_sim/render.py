"""How a run's log reads: its entries as lines, and the short forms of a call, an
outcome and the plan the log's first entry records."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..._core.calls import Call, Ok, Outcome
from .resources import INTENTS

if TYPE_CHECKING:
    from .plan import RunPlan


def render_entry(entry: tuple[float, str, str, Any]) -> str:
    t, who, kind, data = entry
    text = json.dumps(data, sort_keys=True, default=str, separators=(",", ":"))
    return f"{t:13.6f} {who:<9} {kind} {text}"


def plan_summary(p: RunPlan) -> dict[str, Any]:
    return {
        "profile": p.profile,
        "workers": p.workers,
        "jobs": p.jobs,
        "cutoff": p.cutoff,
        "lease": p.lease,
        "heartbeat": p.heartbeat,
        "jitter": p.jitter,
        "max_attempts": p.max_attempts,
        "stage_budget": p.stage_budget,
        "concurrency": p.concurrency,
        "receive_wait": p.receive_wait,
        "sdk_attempts": p.sdk_attempts,
        "sqs": {
            "stale_mode": p.sqs.stale_mode,
            "spelling": p.sqs.spelling,
            "expired_cmv": p.sqs.expired_cmv,
            "duplicate": round(p.sqs.duplicate, 4),
        },
        "max_receive": p.max_receive,
        "ddb_idempotent_tokens": p.ddb.idempotent_tokens,
        "fault_events": p.fault_events,
        **({"widened": sorted(p.wide.features)} if p.wide.features else {}),
    }


def call_key(c: Call) -> str:
    params = c.params
    if "Key" in params:
        return "/".join(str(next(iter(v.values()))) for v in params["Key"].values())
    if "Item" in params:
        item = params["Item"]
        for k in ("job_id", "intent_key"):
            if k in item:
                return str(item[k]["S"])
    if "RequestItems" in params:
        keys = [
            str(next(iter(v.values())))
            for spec in params["RequestItems"].values()
            for k in spec.get("Keys", [])
            for v in k.values()
        ]
        return ",".join(keys)
    if "TransactItems" in params:
        parts = []
        for entry in params["TransactItems"]:
            kind, spec = next(iter(entry.items()))
            key = spec.get("Key") or spec.get("Item") or {}
            first: Mapping[str, Any] = next(iter(key.values()), {})
            parts.append(f"{kind}:{next(iter(first.values()), '')}")
        return ",".join(parts)
    if "ReceiptHandle" in params:
        return str(params["ReceiptHandle"])
    if "Entries" in params:
        return ",".join(str(e.get("ReceiptHandle", "")) for e in params["Entries"])
    if "MessageBody" in params:
        return str(params["MessageBody"])[:80]
    return ""


def txn_kind(c: Call) -> str:
    """Which intent transaction this is: start, confirm or attempt_failed."""
    items = list(c.params.get("TransactItems", []))
    if items and "ConditionCheck" in items[0]:
        return "intent_start"
    for entry in items:
        spec = entry.get("Update", {})
        if spec.get("TableName") == INTENTS:
            states = {v.get("S") for v in spec.get("ExpressionAttributeValues", {}).values()}
            return "intent_confirm" if "confirmed" in states else "intent_reopen"
    return "attempt_close"


def brief(out: Outcome) -> str:
    if isinstance(out, Ok):
        r = out.response
        if "Messages" in r:
            return "ok " + ",".join(
                f"{m['MessageId']}#{m.get('Attributes', {}).get('ApproximateReceiveCount', '?')}"
                for m in r["Messages"]
            )
        if r.get("Failed"):
            return "ok failed=" + ",".join(f"{f['Id']}:{f['Code']}" for f in r["Failed"])
        if r.get("UnprocessedKeys"):
            return "ok unprocessed"
        return "ok"
    codes = ",".join(str(x.get("Code", "")) for x in out.reasons)
    return f"{out.code or out.kind.value}" + (f" [{codes}]" if codes else "")
