"""Re-sending the runs of a distributed campaign that nothing will finish any more.

Every ``reconcile_interval_s`` the reconciler re-sends a running run whose claim expired (its
worker died or stalled past ``claim_ttl_s``: recovery within ~claim TTL + interval) and a
queued run the broker has lost (a Redis restart); after a Redis restart (its ``run_id``
changed) it re-sends every pending run it has out that Redis does not know (the runs Redis knew
at start and the window has not reached yet are sent when it does). A run that failed
``max_task_failures`` times is poison (``Dispatcher.drop_poisoned``), never sent again.
"""

from __future__ import annotations

import redis

from orchestrator.distributed.completion import CompletionTracker
from orchestrator.distributed.context import CampaignContext
from orchestrator.distributed.dispatcher import Dispatcher
from orchestrator.distributed.publisher import Publisher
from workers.state.broker_view import unacked_ids, waiting_ids


class Reconciler:
    """Finds one campaign's lost runs and sends them again through ``publisher``.

    ``broker_redis``: the broker's Redis, whose queue and unacknowledged messages it lists;
    ``tracker`` says which runs are pending, ``dispatcher`` which are not sent yet and which
    are poison.
    """

    def __init__(self, ctx: CampaignContext, publisher: Publisher, tracker: CompletionTracker,
                 dispatcher: Dispatcher, broker_redis: redis.Redis) -> None:
        self._ctx = ctx
        self._publisher = publisher
        self._tracker = tracker
        self._dispatcher = dispatcher
        self._broker_redis = broker_redis
        self._server: str | None = None  # the Redis server's run id, changed by a restart
        self._last = 0.0

    def start(self) -> None:
        """Note the Redis server the campaign starts on (before the campaign state is read:
        a restart after this is seen by the next look)."""
        self._server = self._ctx.call(self._ctx.state.server_run_id, "reading the server id")

    def wait_from_now(self) -> None:
        """The first look is ``reconcile_interval_s`` from now."""
        self._last = self._ctx.clock()

    def reconcile(self) -> int:
        """Once per ``reconcile_interval_s``: re-send runs whose worker died (claim expired) or
        that the broker lost; after a Redis restart, every pending run Redis does not know.
        Returns runs re-sent."""
        now = self._ctx.clock()
        if now - self._last < self._ctx.options.reconcile_interval_s:
            return 0
        self._last = now
        return self._after_restart() + self._claims_expired() + self._missing_from_broker()

    def _after_restart(self) -> int:
        ctx = self._ctx
        server = ctx.call(ctx.state.server_run_id, "reading the server id")
        if server == self._server:
            return 0
        self._server = server
        out = {rid: i for rid, i in ctx.plan.inflight.items() if self._tracker.is_pending(i)}
        known = ctx.call(lambda: ctx.state.known(out), "reading the campaign state")
        self._tracker.restart_log()
        self._dispatcher.forget_known()
        lost = ctx.plan.out(i for rid, i in out.items() if rid not in known)
        self._publisher.resend(lost, "redis_restart")
        return len(lost)

    def _claims_expired(self) -> int:
        ctx = self._ctx
        running = ctx.call(ctx.state.claims.running, "reading running runs")
        if not running:
            return 0
        dead = ctx.call(lambda: ctx.state.claims.lost(running), "finding dead claims")
        tasks = self._dispatcher.drop_poisoned(self._dispatcher.pending_out(dead))
        self._publisher.resend(tasks, "claim_expired")
        return len(tasks)

    def _missing_from_broker(self) -> int:
        ctx = self._ctx
        queued = ctx.call(ctx.state.queued.dispatched_at, "reading queued runs")
        if not queued:
            return 0
        now_r = ctx.call(ctx.state.now_s, "reading the Redis clock")
        ttl = ctx.options.claim_ttl_s
        out = self._dispatcher.pending_out([r for r, s in queued.items() if s < now_r - ttl])
        old = {rid: queued[rid] for rid in (ctx.plan.run_id(i) for i in out)}
        if not old:
            return 0
        client, queue = self._broker_redis, ctx.options.queue
        waiting = ctx.call(lambda: waiting_ids(client, queue), "listing the broker queue")
        unacked = ctx.call(lambda: unacked_ids(client), "listing unacknowledged messages")
        # in a worker's hands but never claimed for 3 TTLs: that worker is gone (its prefetch)
        lost = ctx.plan.out(ctx.plan.inflight[r] for r, s in old.items()
                            if r not in waiting and (r not in unacked or s < now_r - 3 * ttl))
        self._publisher.resend(lost, "missing_from_broker")
        return len(lost)
