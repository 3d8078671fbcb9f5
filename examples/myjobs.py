# myjobs.py: the app; importing it only defines (run.py and `sqs-lease worker myjobs:app` use it)
from pydantic import BaseModel

from sqs_lease import App, CheckAnswer, EffectCall, IntentView, JobContext, ToolResult, Verdict

charges: dict[str, str] = {}  # stands in for a payment service that keeps idempotency keys


def charge(call: EffectCall) -> ToolResult:  # the tool call; really: http_json(call, PSP_URL)
    charges.setdefault(call.key, f"ch_{len(charges) + 1}")
    return ToolResult({"charged": True}, external_id=charges[call.key])


def lookup_charge_by_key(intent: IntentView) -> CheckAnswer:  # outcome unknown: did it apply?
    if intent.key in charges:
        return CheckAnswer(Verdict.CONFIRMED, external_id=charges[intent.key])
    return CheckAnswer(Verdict.NOT_APPLIED)


app = App()
app.target("payments", check=lookup_charge_by_key, key_retention_seconds=86_400)


class Capture(BaseModel):
    invoice: str
    amount: int


@app.job("capture", payload=Capture, lease_seconds=30, heartbeat_seconds=5)
def capture(ctx: JobContext[Capture], p: Capture) -> dict[str, str | None]:
    done = ctx.effect("capture", "payments", p, charge, key=f"payment:{p.invoice}:capture")
    return {"charge_id": done.external_id}
