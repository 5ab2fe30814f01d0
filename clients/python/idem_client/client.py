"""The synchronous client: every call of the JSON API, run() and once()."""

from __future__ import annotations

import logging
import random
import ssl
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable, Dict, List, Optional

from . import _core
from ._core import (Checkpoint, KeyPage, Policy, Record, Reservation, Response, RunResult, as_response, batch_complete_body,
                    batch_reserve_body, batch_results, key_path, list_path, new_owner_token, ns_path, reserve_body, retry_wait)
from .errors import (ExpiredError, FingerprintMismatchError, IdemError, InProgressError, InvalidArgumentError,
                     LeaseLostError, NotFoundError, NotOwnerError, PayloadTooLargeError, PermanentError)

log = logging.getLogger("idem_client")

#: How once() stores an event's end.
ONCE_DONE = 200
ONCE_FAILED = 422


@dataclass
class Lease:
    """What run()'s fn knows about its hold on the key."""

    fencing_token: int
    #: An earlier owner's lease ran out before it completed: it may have done part of the work.
    reclaimed: bool
    previous_fencing_token: Optional[int]
    owner_token: str
    #: The lease's end when fn started (renewed while fn runs).
    expires_at: Optional[datetime]
    #: The reclaimed attempt's last checkpoint (v1.2).
    checkpoint: Optional[Checkpoint] = None
    #: Set when the lease is lost (threading.Event for Client, asyncio.Event for AsyncClient).
    lost: Any = field(default_factory=threading.Event)
    _save: Any = field(default=None, repr=False)

    def save_checkpoint(self, name: str, data: Any) -> Any:
        """Records a recovery point (v1.2); a later RECLAIMED attempt finds it in
        lease.checkpoint. With AsyncClient, await the result."""
        if self._save is None:
            raise InvalidArgumentError("INVALID_ARGUMENT", "idem: this lease cannot checkpoint (it is not run()'s)")
        return self._save(name, data)

    def check(self) -> None:
        """Raises LeaseLostError once the lease is lost: call it between steps of fn."""
        if self.lost.is_set():
            raise LeaseLostError("idem: the lease was lost; another owner may run the key")


class Client:
    """A client of idem's JSON API (any node or router).

    ``base_url`` is the JSON API (http://127.0.0.1:8080 for a dev node);
    ``token`` a bearer token; ``ssl_context`` an ssl.SSLContext for https
    (load_verify_locations for a private CA, load_cert_chain for mTLS).
    Answers 503 and 429 are retried after Retry-After, transport failures
    after a backoff, up to ``max_attempts``; every call is safe to repeat
    (reserve picks its owner token before the first attempt). ``timeout``
    (seconds) bounds one attempt; a waiting reserve adds its wait, and a
    request body a second per MiB, as nodes and routers give it. A 413
    answer, or a connection the server closes while a body larger than
    ``max_request_bytes`` (the limit of a node with the default
    --max-response-bytes) is being sent, raises PayloadTooLargeError at once.
    """

    def __init__(self, base_url: str, token: Optional[str] = None, ssl_context: Optional[ssl.SSLContext] = None,
                 timeout: float = _core.DEFAULT_TIMEOUT, max_attempts: int = _core.DEFAULT_MAX_ATTEMPTS,
                 max_retry_after: float = _core.DEFAULT_MAX_RETRY_AFTER,
                 max_request_bytes: int = _core.DEFAULT_MAX_REQUEST_BYTES):
        self.base_url = base_url
        self.max_attempts = max_attempts
        self.max_retry_after = max_retry_after
        self.transport = _core.Transport(base_url, timeout, ssl_context, token, max_request_bytes)

    # -- one call -------------------------------------------------------

    def call(self, method: str, path: str, body: Optional[Dict[str, Any]] = None, retry: bool = True,
             extra_timeout: float = 0.0) -> Dict[str, Any]:
        attempts = self.max_attempts if retry else 1
        last: Optional[IdemError] = None
        for attempt in range(1, attempts + 1):
            try:
                parsed, err = self.transport.attempt(method, path, body, extra_timeout).decode(method, path)
            except IdemError as e:
                parsed, err = None, e
            if err is None:
                return parsed  # type: ignore[return-value]
            last = err
            wait = retry_wait(err, attempt, self.max_retry_after)
            if wait is None or attempt == attempts:
                break
            log.debug("idem: retrying %s %s in %.2fs after %s", method, path, wait, err)
            time.sleep(wait)
        assert last is not None
        raise last

    # -- the API --------------------------------------------------------

    def reserve(self, ns: str, key: str, fingerprint: Optional[str] = None, lease_ms: Optional[int] = None,
                owner_token: Optional[str] = None, wait_ms: Optional[int] = None, if_expired: Optional[str] = None) -> Reservation:
        """Reserves a key. The owner token is chosen here when not given, so a retry is the same reservation."""
        body = reserve_body(fingerprint, lease_ms, owner_token, wait_ms, if_expired)
        return Reservation.from_json(self.call("POST", key_path(ns, key) + ":reserve", body, extra_timeout=(wait_ms or 0) / 1000))

    def heartbeat(self, ns: str, key: str, owner_token: str, lease_ms: Optional[int] = None) -> Optional[datetime]:
        """Renews the lease; returns its new end."""
        body: Dict[str, Any] = {"owner_token": owner_token}
        if lease_ms:
            body["lease_ms"] = int(lease_ms)
        return _core._time(self.call("POST", key_path(ns, key) + ":heartbeat", body).get("lease_expires_at"))

    def complete(self, ns: str, key: str, owner_token: str, response: Any, retention_s: Optional[int] = None):
        """Stores the final response; returns (completed_at, expires_at)."""
        body: Dict[str, Any] = {"owner_token": owner_token, "response": as_response(response).to_json()}
        if retention_s:
            body["retention_s"] = int(retention_s)
        a = self.call("POST", key_path(ns, key) + ":complete", body)
        return _core._time(a.get("completed_at")), _core._time(a.get("expires_at"))

    def release(self, ns: str, key: str, owner_token: str) -> None:
        self.call("POST", key_path(ns, key) + ":release", {"owner_token": owner_token})

    def get(self, ns: str, key: str) -> Optional[Record]:
        """The key's record, or None when absent or past retention."""
        try:
            return Record.from_json(self.call("GET", key_path(ns, key)))
        except NotFoundError:
            return None

    def list_keys(self, ns: str, state: Optional[str] = None, older_than_s: Optional[int] = None,
                  limit: Optional[int] = None, page_token: Optional[str] = None) -> KeyPage:
        """One page of a namespace's keys (operator action; reader role)."""
        return KeyPage.from_json(self.call("GET", list_path(ns, state, older_than_s, limit, page_token)))

    def force_release(self, ns: str, key: str, reason: str) -> Optional[int]:
        """Frees a stuck IN_PROGRESS key (admin); returns the previous fencing token."""
        return _core._token(self.call("POST", key_path(ns, key) + ":force-release", {"reason": reason}).get("previous_fencing_token"))

    def delete_key(self, ns: str, key: str, reason: str) -> None:
        """Deletes a key's record (admin)."""
        self.call("DELETE", key_path(ns, key), {"reason": reason})

    # -- v1.2 -----------------------------------------------------------

    def batch_reserve(self, ns: str, items: List[Dict[str, Any]]) -> List[Any]:
        """Reserves up to 1000 keys in one call (v1.2). items: dicts with key,
        fingerprint, owner_token, lease_ms. Per item, in order, a Reservation
        or a BatchError."""
        return batch_results(self.call("POST", ns_path(ns, "keys:batch-reserve"), batch_reserve_body(items)), Reservation.from_json)

    def batch_complete(self, ns: str, items: List[Dict[str, Any]]) -> List[Any]:
        """Completes up to 1000 keys in one call (v1.2). items: dicts with key,
        owner_token, response, retention_s. Per item (completed_at,
        expires_at) or a BatchError."""
        return batch_results(self.call("POST", ns_path(ns, "keys:batch-complete"), batch_complete_body(items)),
                             lambda r: (_core._time(r.get("completed_at")), _core._time(r.get("expires_at"))))

    def checkpoint(self, ns: str, key: str, owner_token: str, name: str, data: Any) -> Optional[datetime]:
        """Records a recovery point of the running attempt (v1.2); a RECLAIMED
        answer carries the last one. Returns checkpointed_at."""
        body = {"owner_token": owner_token, "name": name, "data": _core.encode_body(data)}
        return _core._time((self.call("POST", key_path(ns, key) + ":checkpoint", body)).get("checkpointed_at"))

    def get_policy(self, ns: str) -> Policy:
        """The namespace's policy in force (v1.2)."""
        return Policy.from_json(self.call("GET", ns_path(ns, "policy")))

    def set_policy(self, ns: str, policy: Policy) -> Policy:
        """Sets the namespace's policy (v1.2, admin); None fields keep the built-in defaults."""
        return Policy.from_json(self.call("PUT", ns_path(ns, "policy"), policy.to_json()))

    # -- run and once ---------------------------------------------------

    def run(self, ns: str, key: str, fn: Callable[[Lease], Any], fingerprint: Optional[str] = None,
            lease_ms: int = _core.DEFAULT_LEASE_MS, retention_s: Optional[int] = None,
            max_wait: float = _core.DEFAULT_MAX_WAIT, if_expired: Optional[str] = None) -> RunResult:
        """Runs fn at most once to completion for (ns, key), across every process
        and retry using the key (the Go client's Do).

        Reserves the key; replays a completed key (fn does not run); waits up to
        ``max_wait`` seconds for a running owner (then InProgressError); raises
        FingerprintMismatchError for another request's key. Otherwise runs
        fn(lease) while a thread renews the lease every third of it;
        ``lease.lost`` is set if the lease is lost (fn should check it between
        steps). fn's return value (a Response, a (status, headers, body) tuple
        or a dict) completes the key; an exception releases it (so a retry runs
        again) and propagates, except a PermanentError, whose response is stored.
        """
        token = new_owner_token()
        wait_until = time.monotonic() + max_wait
        poll = 0.02
        store_wait = 0
        while True:
            sent_at = time.monotonic()
            res = self.reserve(ns, key, fingerprint=fingerprint, lease_ms=lease_ms, owner_token=token, wait_ms=store_wait,
                               if_expired=if_expired)
            decided = _decide(ns, key, res, max_wait)
            if decided is not None:
                return decided
            if res.outcome in ("ACQUIRED", "RECLAIMED"):
                return self._run_owned(ns, key, res, sent_at, fn, lease_ms, retention_s)
            remaining = wait_until - time.monotonic()
            if remaining < 0.001:
                raise InProgressError(f"idem: {ns}/{key} is held by another owner whose lease ends at {res.lease_expires_at}; waited {max_wait}s",
                                      res.lease_expires_at)
            asked = store_wait
            store_wait = min(int(remaining * 1000), _core.STORE_MAX_WAIT_MS)
            if asked == 0 or time.monotonic() - sent_at >= asked / 2000:
                continue  # the store waited (or was not asked to): ask it to wait again
            # The store answered well before the wait it was asked for: pause as
            # a poller would, so this never becomes a tight loop.
            wait = min(poll, remaining, res.retry_after or poll)
            poll = min(2 * poll, 1.0)
            time.sleep(wait / 2 + random.random() * wait / 2)

    def _run_owned(self, ns: str, key: str, res: Reservation, sent_at: float, fn: Callable[[Lease], Any],
                   lease_ms: int, retention_s: Optional[int]) -> RunResult:
        lease = Lease(res.fencing_token or 0, res.outcome == "RECLAIMED", res.previous_fencing_token, res.owner_token or "",
                      res.lease_expires_at, res.checkpoint, threading.Event(),
                      lambda name, data: self.checkpoint(ns, key, res.owner_token or "", name, data))
        stop = threading.Event()
        hb = threading.Thread(target=self._keep_lease, args=(ns, key, lease, lease_ms, sent_at + lease_ms / 1000, stop),
                              name=f"idem-heartbeat-{key[:32]}", daemon=True)
        hb.start()
        try:
            out = fn(lease)
        except PermanentError as e:
            stop.set()
            hb.join()
            self._finish(ns, key, lease, e.response, retention_s)
            raise
        except BaseException as e:
            stop.set()
            hb.join()
            self._release(ns, key, lease.owner_token)
            if lease.lost.is_set() and isinstance(e, Exception):
                raise LeaseLostError(f"idem: {ns}/{key}: the lease was lost while fn ran: {e}") from e
            raise
        stop.set()
        hb.join()
        response = as_response(out)
        completed_at, expires_at = self._finish(ns, key, lease, response, retention_s)
        return RunResult(response, False, lease.fencing_token, completed_at, expires_at)

    def _release(self, ns: str, key: str, owner_token: str) -> None:
        try:
            self.release(ns, key, owner_token)
        except NotOwnerError:
            pass
        except IdemError as e:
            log.warning("idem: release of %s/%s failed; the key stays reserved until its lease runs out: %s", ns, key, e)

    def _finish(self, ns: str, key: str, lease: Lease, response: Any, retention_s: Optional[int]):
        try:
            return self.complete(ns, key, lease.owner_token, response, retention_s)
        except NotOwnerError as e:
            raise LeaseLostError(f"idem: {ns}/{key}: another owner took the key while fn ran; its work may be repeated") from e
        except (InvalidArgumentError, PayloadTooLargeError) as e:
            self._release(ns, key, lease.owner_token)
            raise type(e)(e.code, f"idem: {ns}/{key}: fn's response cannot be stored, so the key was released: {e}", e.status) from e
        except IdemError as e:
            raise type(e)(e.code, f"idem: {ns}/{key}: fn finished but completing failed; the key stays reserved until its lease runs out "
                                  f"and the next owner reclaims it: {e}", e.status, e.retry_after) from e

    def _keep_lease(self, ns: str, key: str, lease: Lease, lease_ms: int, local_end: float, stop: threading.Event) -> None:
        """Renews the lease every third of it until stop; sets lease.lost when a
        renewal answers NOT_OWNER or renewals fail until the lease's end by our
        clock (counted from before the reserve was sent: early, never late)."""
        interval = lease_ms / 3000
        wait = interval
        while not stop.wait(wait):
            sent = time.monotonic()
            try:
                self.transport_heartbeat(ns, key, lease.owner_token, lease_ms, max(local_end - sent, 0.001))
                local_end = sent + lease_ms / 1000
                wait = interval
            except NotOwnerError:
                log.warning("idem: lease of %s/%s lost: another owner holds the key", ns, key)
                lease.lost.set()
                return
            except IdemError as e:
                if time.monotonic() >= local_end:
                    log.warning("idem: lease of %s/%s lost: heartbeats failed until it ran out: %s", ns, key, e)
                    lease.lost.set()
                    return
                log.warning("idem: heartbeat of %s/%s failed; retrying: %s", ns, key, e)
                wait = max(min(interval / 4, local_end - time.monotonic()), 0.001)

    def transport_heartbeat(self, ns: str, key: str, owner_token: str, lease_ms: int, timeout: float) -> None:
        """One heartbeat attempt, bounded by timeout (no retries: the loop retries)."""
        path = key_path(ns, key) + ":heartbeat"
        _, err = self.transport.attempt("POST", path, {"owner_token": owner_token, "lease_ms": lease_ms},
                                        timeout=min(timeout, self.transport.timeout)).decode("POST", path)
        if err is not None:
            raise err

    def once(self, ns: str, event_id: str, fn: Callable[[int, Lease], Any], **kwargs: Any) -> bool:
        """Runs fn(fencing_token, lease) at most once to completion per (ns,
        event_id): consumer-side deduplication of at-least-once delivery.
        Returns True when this call ran fn. A PermanentError from fn is
        remembered: later deliveries raise PermanentError without running fn."""
        ran = False

        def body(lease: Lease) -> Response:
            nonlocal ran
            ran = True
            try:
                fn(lease.fencing_token, lease)
            except PermanentError as e:
                raise PermanentError(str(e), Response(ONCE_FAILED, {}, str(e).encode()[:4096])) from e
            return Response(ONCE_DONE)

        res = self.run(ns, event_id, body, **kwargs)
        return _once_result(ns, event_id, ran, res)


def _decide(ns: str, key: str, res: Reservation, max_wait: float) -> Optional[RunResult]:
    """run()'s answer for a reserve that needs no owner: a replay, or an error."""
    if res.outcome == "COMPLETED":
        assert res.response is not None
        return RunResult(res.response, True, res.fencing_token, res.completed_at, res.expires_at)
    if res.outcome == "FINGERPRINT_MISMATCH":
        raise FingerprintMismatchError(f"idem: {ns}/{key} is in use for another request (fingerprint mismatch)")
    if res.outcome == "EXPIRED":
        raise ExpiredError(f"idem: {ns}/{key} was completed and its response has expired", res.fencing_token, res.completed_at, res.expired_at)
    if res.outcome not in ("ACQUIRED", "RECLAIMED", "IN_PROGRESS"):
        raise IdemError("INTERNAL", f"idem: run {ns}/{key}: unexpected outcome {res.outcome}")
    return None


def _once_result(ns: str, event_id: str, ran: bool, res: RunResult) -> bool:
    if not ran and res.response.status == ONCE_FAILED:
        raise PermanentError(f"idem: event {ns}/{event_id} failed permanently before: {res.response.body.decode(errors='replace')}",
                             res.response)
    return ran
