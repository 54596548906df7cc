"""The classic consumer-group protocol's coordinator: membership, generations and the rebalance barrier.

A group moves through Kafka's states (GroupMetadata.scala):

1. EMPTY: no members. Such a group is not kept (its committed offsets are on disk), so requests naming group ids
   nobody joined cost no memory; a JoinGroup without a member id creates it, in PREPARING_REBALANCE. From JoinGroup
   version 4 (KIP-394) a join without a member id is answered MEMBER_ID_REQUIRED with a new member id and makes no
   member: the id is only pending (GroupCoordinator.pending) until a join with it, and dropped after the session
   timeout the join asked, so anonymous joins cannot hold members nor connections at the barrier.
2. PREPARING_REBALANCE: the barrier. Every known member must send JoinGroup again (members learn of the
   rebalance from Heartbeat's REBALANCE_IN_PROGRESS); the barrier closes when all have and no member id of the
   group is pending (Kafka's hasAllMembersJoined: a pending one joins or expires first), or at the rebalance
   deadline (the largest rebalance timeout of the members), dropping those that did not. Closing bumps the
   generation, picks the protocol every member supports and a leader (the previous one if it rejoined), and
   answers every pending JoinGroup; only the leader gets the member list. Then COMPLETING_REBALANCE.
3. COMPLETING_REBALANCE: followers' SyncGroup waits for the leader's, which carries every assignment. Then STABLE.
   A member that sends no SyncGroup within the rebalance timeout of the join's answer (a leader that heartbeats
   and never assigns would hold the group here for ever) is dropped, as Kafka drops its pending-sync members.
4. STABLE: heartbeats keep members alive; a join, a leave or a member whose session times out (no request
   within session.timeout.ms) starts a new rebalance.

Everything runs on the endpoint's event loop: no locks, and a waiting member is a pending future.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from ledgerview.kafka.protocol import ErrorCode

log = logging.getLogger(__name__)


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"


@dataclass(frozen=True)
class JoinResult:
    error: ErrorCode
    generation: int = -1
    protocol: str = ""
    leader: str = ""
    member_id: str = ""
    members: list[tuple[str, bytes]] = field(default_factory=list)
    """(member id, protocol metadata) of every member; only the leader's result has them."""


@dataclass(frozen=True)
class JoinRequest:
    member_id: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    """(assignor name, member metadata), in the member's order of preference."""
    require_member_id: bool = False
    """KIP-394 (JoinGroup version 4 and up): a join without a member id is answered MEMBER_ID_REQUIRED with one."""


@dataclass
class Member:
    member_id: str
    request: JoinRequest
    last_seen: float
    joining: asyncio.Future[JoinResult] | None = None
    syncing: asyncio.Future[tuple[ErrorCode, bytes]] | None = None
    assignment: bytes = b""


@dataclass
class Group:
    group_id: str
    state: GroupState = GroupState.EMPTY
    generation: int = 0
    leader: str | None = None
    protocol: str | None = None
    protocol_type: str | None = None
    members: dict[str, Member] = field(default_factory=dict)
    rebalance_deadline: float = 0.0
    unsynced: set[str] = field(default_factory=set)
    """Kafka's pending-sync members: those the last rebalance answered that have sent no SyncGroup since; the ones
    still here at sync_deadline are dropped."""
    sync_deadline: float = 0.0


class GroupCoordinator:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.groups: dict[str, Group] = {}
        self.emptied: dict[str, float] = {}
        """When each group lost its last member (clock seconds): as Kafka (KIP-211), offsets.retention.minutes counts
        an empty group's offsets from then, not from each commit (offsets_retention.py, which prunes this)."""
        self.pending: dict[str, dict[str, float]] = {}
        """Kafka's pending members: by group id, the member ids answered MEMBER_ID_REQUIRED, each with when it is
        dropped (clock seconds) unless a JoinGroup with that id comes first. Kept apart from the groups, which exist
        only while they have members; a group id is here only while it has pending ids."""

    # ---------------------------------------------------------------------------------------------- requests
    async def join(self, group_id: str, request: JoinRequest, *, max_size: int = 2**31 - 1) -> JoinResult:
        """Kafka's handleJoinGroup for dynamic members; ``max_size`` is group.max.size."""
        group = self.groups.get(group_id) or Group(group_id)  # kept in self.groups once it has a member
        if not self._accepts(group, request.member_id, max_size):
            # As Kafka: a member of the group refused here (one that had not rejoined a barrier already full) is
            # removed, and a pending one too.
            self._drop_pending(group_id, request.member_id)
            if (member := group.members.get(request.member_id)) is not None:
                self._remove(group, member)
            self._maybe_complete_join(group_id)
            return JoinResult(ErrorCode.GROUP_MAX_SIZE_REACHED)
        if group.members and request.protocol_type != group.protocol_type:
            return JoinResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL)
        # Kafka's supportsProtocols: one of the member's protocols must be every other member's too, so the group
        # always has a protocol all its members support (_complete_join picks it).
        others = [m for m in group.members.values() if m.member_id != request.member_id]
        shared = {name for name, _ in request.protocols}.intersection(
            *({name for name, _ in m.request.protocols} for m in others))
        if not shared:
            return JoinResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL)
        if request.member_id and self._drop_pending(group_id, request.member_id):
            member = group.members[request.member_id] = Member(request.member_id, request, self.clock())
            self.groups[group_id] = group
        elif request.member_id:
            member = group.members.get(request.member_id)
            if member is None:
                return JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, member_id=request.member_id)
            if self._rejoins_unchanged(group, member, request):
                member.last_seen = self.clock()
                return self._current_generation(group, member)
            member.request = request
        elif request.require_member_id:
            member_id = f"member-{uuid.uuid4()}"
            self.pending.setdefault(group_id, {})[member_id] = self.clock() + request.session_timeout_ms / 1000
            return JoinResult(ErrorCode.MEMBER_ID_REQUIRED, member_id=member_id)
        else:
            member_id = f"member-{uuid.uuid4()}"
            member = group.members[member_id] = Member(member_id, request, self.clock())
            self.groups[group_id] = group
        group.protocol_type = request.protocol_type
        member.last_seen = self.clock()
        if member.joining is not None and not member.joining.done():
            member.joining.set_result(JoinResult(ErrorCode.REBALANCE_IN_PROGRESS, member_id=member.member_id))
        member.joining = asyncio.get_running_loop().create_future()
        joining = member.joining
        if group.state is not GroupState.PREPARING_REBALANCE:
            self._prepare_rebalance(group)
        if self._all_joined(group):
            self._complete_join(group)
        return await joining

    async def sync(self, group_id: str, generation: int, member_id: str,
                   assignments: dict[str, bytes]) -> tuple[ErrorCode, bytes]:
        known = self._member(group_id, member_id)
        if known is None:
            return ErrorCode.UNKNOWN_MEMBER_ID, b""
        group, member = known
        if generation != group.generation:
            return ErrorCode.ILLEGAL_GENERATION, b""
        if group.state is GroupState.PREPARING_REBALANCE:
            return ErrorCode.REBALANCE_IN_PROGRESS, b""
        group.unsynced.discard(member_id)
        if group.state is GroupState.STABLE:
            return ErrorCode.NONE, member.assignment
        if member_id == group.leader:
            for each in group.members.values():
                each.assignment = assignments.get(each.member_id, b"")
            group.state = GroupState.STABLE
            for each in group.members.values():
                if each.syncing is not None and not each.syncing.done():
                    each.syncing.set_result((ErrorCode.NONE, each.assignment))
                each.syncing = None
            return ErrorCode.NONE, member.assignment
        if member.syncing is not None and not member.syncing.done():
            # A second SyncGroup while the first waits (a client that gave up on it and retried on a new
            # connection): the first is answered, or its connection, which reads no request while it waits, would
            # be held for ever.
            member.syncing.set_result((ErrorCode.REBALANCE_IN_PROGRESS, b""))
        member.syncing = asyncio.get_running_loop().create_future()
        return await member.syncing

    def heartbeat(self, group_id: str, generation: int, member_id: str) -> ErrorCode:
        known = self._member(group_id, member_id)
        if known is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        group, _ = known
        if group.state is GroupState.PREPARING_REBALANCE:
            return ErrorCode.REBALANCE_IN_PROGRESS
        if generation != group.generation:
            return ErrorCode.ILLEGAL_GENERATION
        return ErrorCode.NONE

    def leave(self, group_id: str, member_ids: list[str]) -> list[ErrorCode]:
        errors = []
        for member_id in member_ids:
            if self._drop_pending(group_id, member_id):
                self._maybe_complete_join(group_id)
                errors.append(ErrorCode.NONE)
                continue
            known = self._member(group_id, member_id)
            if known is None:
                errors.append(ErrorCode.UNKNOWN_MEMBER_ID)
                continue
            self._remove(*known)
            errors.append(ErrorCode.NONE)
        return errors

    def check_commit(self, group_id: str, generation: int, member_id: str) -> ErrorCode:
        """Whether an offset commit may be stored, by Kafka's rules (ClassicGroup.validateOffsetCommit): one outside
        any generation (-1: an assign-only consumer, an admin tool) only while the group has no member, so that it
        cannot overwrite what the members commit; else one from a member of the current generation, once the
        rebalance that made the generation is complete (its SyncGroup answered)."""
        group = self.groups.get(group_id)
        if group is None:  # no member
            return ErrorCode.NONE if generation < 0 else ErrorCode.ILLEGAL_GENERATION
        if self._member(group_id, member_id) is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if generation != group.generation:
            return ErrorCode.ILLEGAL_GENERATION
        if group.state is GroupState.COMPLETING_REBALANCE:
            return ErrorCode.REBALANCE_IN_PROGRESS
        return ErrorCode.NONE

    # ------------------------------------------------------------------------------------------------ timers
    def expire(self) -> None:
        """Drop members whose session timed out and close barriers whose deadline passed; called every
        fraction of a second by the endpoint."""
        now = self.clock()
        for group_id, pending in list(self.pending.items()):
            for member_id in [member_id for member_id, deadline in pending.items() if now > deadline]:
                log.debug("group %s: pending member %s did not join within its session timeout", group_id, member_id)
                self._drop_pending(group_id, member_id)
            self._maybe_complete_join(group_id)
        for group in list(self.groups.values()):
            for member in list(group.members.values()):
                waiting = member.joining is not None
                if not waiting and now - member.last_seen > member.request.session_timeout_ms / 1000:
                    self._remove(group, member)
            if group.state is GroupState.PREPARING_REBALANCE and now >= group.rebalance_deadline:
                self._complete_join(group)
            if group.unsynced and now >= group.sync_deadline:
                log.info("group %s: dropping members that sent no SyncGroup within the rebalance timeout: %s",
                         group.group_id, ", ".join(sorted(group.unsynced)))
                for member in [group.members[member_id] for member_id in group.unsynced]:
                    if member.member_id in group.members:
                        self._remove(group, member)

    # ------------------------------------------------------------------------------------------- transitions
    def _member(self, group_id: str, member_id: str) -> tuple[Group, Member] | None:
        """The group and its member ``member_id``, whose session this request restarts; None when the group has no
        such member. A group id no member is in creates nothing."""
        group = self.groups.get(group_id)
        member = None if group is None else group.members.get(member_id)
        if group is None or member is None:
            return None
        member.last_seen = self.clock()
        return group, member

    def _drop_pending(self, group_id: str, member_id: str) -> bool:
        """Forget a pending member id; whether it was one."""
        pending = self.pending.get(group_id, {})
        if pending.pop(member_id, None) is None:
            return False
        if not pending:
            del self.pending[group_id]
        return True

    def _all_joined(self, group: Group) -> bool:
        """Kafka's hasAllMembersJoined: every member waits at the barrier and no member id of the group is pending."""
        return all(m.joining is not None for m in group.members.values()) and group.group_id not in self.pending

    def _maybe_complete_join(self, group_id: str) -> None:
        """Close the barrier of ``group_id`` if the pending id just dropped was all it waited for."""
        group = self.groups.get(group_id)
        if group is not None and group.state is GroupState.PREPARING_REBALANCE and self._all_joined(group):
            self._complete_join(group)

    @staticmethod
    def _accepts(group: Group, member_id: str, max_size: int) -> bool:
        """Kafka's acceptJoiningMember: whether a join keeps the group within group.max.size. While the barrier is
        up, the members that rejoined it are counted (those that do not are dropped when it closes) and one of them
        is always let in again; otherwise the members are, and any of them is let in."""
        member = group.members.get(member_id)
        if group.state is GroupState.EMPTY:
            return True
        if group.state is GroupState.PREPARING_REBALANCE:
            waiting = sum(m.joining is not None for m in group.members.values())
            return (member is not None and member.joining is not None) or waiting < max_size
        return member is not None or len(group.members) < max_size

    def _rejoins_unchanged(self, group: Group, member: Member, request: JoinRequest) -> bool:
        """Kafka's rule: a member that joins again with the same protocols while the group is stable (and it is
        not the leader) or completing the rebalance gets the current generation back instead of a new rebalance,
        e.g. a client that gave up waiting for its last response. Rebalancing instead can loop for ever."""
        if member.request.protocols != request.protocols:
            return False
        if group.state is GroupState.STABLE:
            return member.member_id != group.leader
        return group.state is GroupState.COMPLETING_REBALANCE

    def _current_generation(self, group: Group, member: Member) -> JoinResult:
        assert group.protocol is not None and group.leader is not None
        return JoinResult(ErrorCode.NONE, group.generation, group.protocol, group.leader, member.member_id,
                          self._listing(group) if member.member_id == group.leader else [])

    def _listing(self, group: Group) -> list[tuple[str, bytes]]:
        assert group.protocol is not None
        return [(m.member_id, dict(m.request.protocols)[group.protocol]) for m in group.members.values()]

    def _prepare_rebalance(self, group: Group) -> None:
        log.debug("group %s: rebalance from %s (generation %d)", group.group_id, group.state.value, group.generation)
        group.state = GroupState.PREPARING_REBALANCE
        group.unsynced.clear()
        timeout_ms = max((m.request.rebalance_timeout_ms for m in group.members.values()), default=0)
        group.rebalance_deadline = self.clock() + timeout_ms / 1000
        for member in group.members.values():
            if member.syncing is not None and not member.syncing.done():
                member.syncing.set_result((ErrorCode.REBALANCE_IN_PROGRESS, b""))
            member.syncing = None

    def _remove(self, group: Group, member: Member) -> None:
        log.debug("group %s: member %s leaves or expires", group.group_id, member.member_id)
        del group.members[member.member_id]
        group.unsynced.discard(member.member_id)
        if member.joining is not None and not member.joining.done():
            member.joining.set_result(JoinResult(ErrorCode.UNKNOWN_MEMBER_ID))
        if member.syncing is not None and not member.syncing.done():
            member.syncing.set_result((ErrorCode.UNKNOWN_MEMBER_ID, b""))
        if not group.members:
            self._forget(group)
        elif group.state is not GroupState.PREPARING_REBALANCE:
            self._prepare_rebalance(group)
        elif self._all_joined(group):
            self._complete_join(group)

    def _complete_join(self, group: Group) -> None:
        for member in [m for m in group.members.values() if m.joining is None]:
            del group.members[member.member_id]  # did not rejoin before the deadline
        group.generation += 1
        if not group.members:
            self._forget(group)
            return
        if group.leader not in group.members:
            group.leader = next(iter(group.members))
        leader = group.members[group.leader]
        supported = [{name for name, _ in m.request.protocols} for m in group.members.values()]
        group.protocol = next(name for name, _ in leader.request.protocols if all(name in s for s in supported))
        group.state = GroupState.COMPLETING_REBALANCE
        group.unsynced = set(group.members)
        timeout_ms = max(m.request.rebalance_timeout_ms for m in group.members.values())
        group.sync_deadline = self.clock() + timeout_ms / 1000
        for member in group.members.values():
            assert member.joining is not None
            member.last_seen = self.clock()  # the session restarts when the join is answered
            if not member.joining.done():
                member.joining.set_result(self._current_generation(group, member))
            member.joining = None

    def _forget(self, group: Group) -> None:
        """The group has no member left: nothing of it stays in memory but when that was (Kafka keeps an empty group
        only for its committed offsets, which here are subscription cursor records on disk: group_offsets.py)."""
        group.state, group.leader, group.protocol = GroupState.EMPTY, None, None
        self.groups.pop(group.group_id, None)
        self.emptied[group.group_id] = self.clock()
