"""``EnvSet``: the K environments one observer or collector plays, stepped together.

An actor that plays several environments sends their K states in one message
and gets their K actions back in one reply, so the runtime's cost per message
is shared by K steps. The environments are either built one by one (a list of
factories, or one factory called K times) or come as one Gymnasium vector
environment. Either way each sub-environment keeps its own episodes: it is
reset alone when its episode ends, and the first reset of sub-environment
``i`` is seeded with ``seed + i``, as Gymnasium seeds a vector environment, so
a set of K plays exactly what K single environments seeded ``seed``,
``seed + 1``, … would.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy
import torch

from actorch._stock.import_paths import resolve

__all__ = ["EnvFactory", "EnvPlayer", "EnvSet", "Rows", "Steps", "state_dtype"]

EnvFactory = Callable[[], Any] | str
"""A function returning an environment (or a vector environment), or its ``"module:function"`` path."""

_SAME_STEP = "SAME_STEP"
_DISABLED = "DISABLED"


class Steps(NamedTuple):
    """What one step of the playing sub-environments gave, one entry per sub-environment stepped.

    Attributes:
        observations: The observation to act on next: after an episode ended,
            the first of the next episode (the sub-environment was reset).
        rewards: The rewards.
        terminated: Whether the episode ended in a terminal state.
        truncated: Whether the episode was cut short (a time limit).
        final: The last observation of an episode that ended (for transitions'
            next state), else the same as ``observations``.
    """

    observations: list[Any]
    rewards: list[float]
    terminated: list[bool]
    truncated: list[bool]
    final: list[Any]


class Rows(NamedTuple):
    """Where one step of every sub-environment is written: NumPy arrays, one row per sub-environment.

    Attributes:
        final: The observation each step gave (an ended episode's last one).
        following: The observation to act on next (after an episode ended, the next one's first).
        rewards: The rewards.
        terminated: Whether the episode ended in a terminal state (written only where it ended).
        truncated: Whether the episode was cut short (written only where it ended).
    """

    final: Any
    following: Any
    rewards: Any
    terminated: Any
    truncated: Any


class EnvSet:
    """K environments behind one interface: reset all, step some, each reset alone when its episode ends.

    Args:
        env: A factory (or its path), or a list of them (one environment each).
            A factory may return a Gymnasium vector environment (anything with
            ``num_envs``); it must reset finished sub-environments in the same
            step or not at all (``autoreset_mode`` ``SAME_STEP`` or ``DISABLED``).
        count: How many environments to build from a single factory (None: 1,
            or the vector environment's own count).

    Raises:
        ValueError: If ``count`` is below 1, disagrees with a list or a vector
            environment, or the list is empty; if a vector environment resets
            in the next step (Gymnasium's default ``NEXT_STEP``), whose steps
            after an episode's end ignore the action.
    """

    def __init__(self, env: EnvFactory | Sequence[EnvFactory], count: int | None = None) -> None:
        if count is not None and (not isinstance(count, int) or isinstance(count, bool) or count < 1):
            raise ValueError(f"num_envs must be an int >= 1, not {count!r}")
        self.vector: Any = None
        self.envs: list[Any] = []
        if isinstance(env, Sequence) and not isinstance(env, str):
            if not env:
                raise ValueError("the list of environment factories is empty")
            if count is not None and count != len(env):
                raise ValueError(f"num_envs={count} disagrees with the {len(env)} environment factories given")
            self.envs = [_build(factory) for factory in env]
        else:
            first = _build(env)
            if hasattr(first, "num_envs"):
                self._take_vector(first, count)
            else:
                self.envs = [first] + [_build(env) for _ in range((count or 1) - 1)]
        self.count = self.vector.num_envs if self.vector is not None else len(self.envs)
        self._actions: list[Any] = [None] * self.count  # a vector environment's last actions, for idle sub-envs

    def __repr__(self) -> str:
        kind = type(self.vector).__name__ if self.vector is not None else "separate"
        return f"<EnvSet {self.count} {kind}>"

    def _take_vector(self, vector: Any, count: int | None) -> None:
        if count is not None and count != vector.num_envs:
            raise ValueError(f"num_envs={count} disagrees with the vector environment's {vector.num_envs}")
        mode = getattr(getattr(vector, "metadata", {}).get("autoreset_mode"), "name", None)
        if mode not in (_SAME_STEP, _DISABLED):
            raise ValueError(
                f"a vector environment must reset finished sub-environments in the same step or not at all, "
                f"not {mode or 'in the next step'}: make it with "
                "vector_kwargs={'autoreset_mode': gymnasium.vector.AutoresetMode.SAME_STEP}"
            )
        self.vector = vector
        self._same_step = mode == _SAME_STEP

    def reset(self, seed: int | None = None) -> list[Any]:
        """Reset every sub-environment and return their observations (sub-env ``i`` seeded ``seed + i``)."""
        if self.vector is not None:
            observations, _ = self.vector.reset(seed=seed) if seed is not None else self.vector.reset()
            return list(observations)
        return [self.reset_one(index, None if seed is None else seed + index) for index in range(self.count)]

    def reset_one(self, index: int, seed: int | None = None) -> Any:
        """Reset sub-environment ``index`` alone and return its observation."""
        if self.vector is not None:
            mask = [position == index for position in range(self.count)]
            options: dict[str, Any] = {"reset_mask": _as_array(mask)}
            observations, _ = self.vector.reset(seed=seed, options=options)
            return observations[index]
        env = self.envs[index]
        observation, _ = env.reset(seed=seed) if seed is not None else env.reset()
        return observation

    def step(self, actions: Sequence[Any], playing: Sequence[int]) -> Steps:
        """Step sub-environments ``playing`` with ``actions`` (one each); reset those whose episode ended.

        A vector environment steps every sub-environment at once: one not
        playing repeats its last action, and what it gives is left out.
        """
        if self.vector is not None:
            return self._step_vector(actions, playing)
        steps = Steps([], [], [], [], [])
        for action, index in zip(actions, playing, strict=True):
            observation, reward, terminated, truncated, _ = self.envs[index].step(action)
            terminated, truncated = bool(terminated), bool(truncated)
            steps.final.append(observation)
            if terminated or truncated:
                observation = self.reset_one(index)
            steps.observations.append(observation)
            steps.rewards.append(float(reward))
            steps.terminated.append(terminated)
            steps.truncated.append(truncated)
        return steps

    def _step_vector(self, actions: Sequence[Any], playing: Sequence[int]) -> Steps:
        last = self._actions
        for action, index in zip(actions, playing, strict=True):
            last[index] = action
        if any(action is None for action in last):  # sub-envs never stepped yet: any of the actions given will do
            last[:] = [actions[0] if action is None else action for action in last]
        observations, rewards, terminated, truncated, info = self.vector.step(_as_array(last))
        ended = [bool(terminated[index] or truncated[index]) for index in playing]
        finals = info.get("final_obs") if self._same_step else None
        steps = Steps([], [], [], [], [])
        for index, done in zip(playing, ended, strict=True):
            observation = observations[index]
            steps.final.append(finals[index] if done and finals is not None else observation)
            steps.rewards.append(float(rewards[index]))
            steps.terminated.append(bool(terminated[index]))
            steps.truncated.append(bool(truncated[index]))
            steps.observations.append(observation)
        if not self._same_step and any(ended):
            mask = [False] * self.count
            for index, done in zip(playing, ended, strict=True):
                mask[index] = done
            fresh, _ = self.vector.reset(options={"reset_mask": _as_array(mask)})
            for position, (index, done) in enumerate(zip(playing, ended, strict=True)):
                if done:
                    steps.observations[position] = fresh[index]
        return steps

    def step_into(self, actions: Sequence[Any], rows: Rows) -> list[int]:
        """Step every sub-environment with ``actions`` (one each), writing what they give into ``rows``.

        The playing loop of a collector: observations are written straight
        into the arrays of its batch, one copy from the environment's own, and
        the rewards, terminations and truncations likewise. Those whose episode
        ended are reset, and their fresh observation written to
        ``rows.following`` in place of the last one (which stays in
        ``rows.final``). Returns their indices. ``rows.terminated`` and
        ``rows.truncated`` must come cleared: only the ended are written.
        """
        if self.vector is not None:
            return self._step_vector_into(actions, rows)
        ended: list[int] = []
        final, rewards = rows.final, rows.rewards
        for index, (env, action) in enumerate(zip(self.envs, actions, strict=True)):
            observation, reward, terminated, truncated, _ = env.step(action)
            final[index] = observation
            rewards[index] = reward
            if terminated or truncated:
                rows.terminated[index] = terminated
                rows.truncated[index] = truncated
                ended.append(index)
        rows.following[...] = final
        for index in ended:
            rows.following[index] = self.reset_one(index)
        return ended

    def _step_vector_into(self, actions: Sequence[Any], rows: Rows) -> list[int]:
        observations, rewards, terminated, truncated, info = self.vector.step(_as_array(list(actions)))
        rows.final[...] = observations
        rows.following[...] = observations
        rows.rewards[...] = rewards
        rows.terminated[...] = terminated
        rows.truncated[...] = truncated
        ended = [int(index) for index in numpy.flatnonzero(numpy.logical_or(terminated, truncated))]
        if not ended:
            return ended
        if self._same_step:
            finals = info["final_obs"]
            for index in ended:
                rows.final[index] = finals[index]
        else:
            mask = numpy.zeros(self.count, dtype=bool)
            mask[ended] = True
            fresh, _ = self.vector.reset(options={"reset_mask": mask})
            rows.following[mask] = fresh[mask]
        return ended

    def close(self) -> None:
        """Close every environment that can be closed."""
        for env in [self.vector] if self.vector is not None else self.envs:
            close = getattr(env, "close", None)
            if callable(close):
                close()


def _build(factory: EnvFactory) -> Any:
    return resolve(factory, "environment factory")()


def _as_array(values: list[Any]) -> Any:
    """``values`` as the NumPy array a vector environment takes."""
    return numpy.asarray(values)


class EnvPlayer:
    """What the actors that play environments share: their environments, and the hooks that convert for them.

    Mixed into :class:`~actorch.Observer` and :class:`~actorch.Collector`.
    """

    envs: EnvSet
    num_envs: int
    max_steps: int

    def _open_envs(self, env: EnvFactory | Sequence[EnvFactory], num_envs: int | None, max_steps: int) -> None:
        if max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, not {max_steps!r}")
        self.envs = EnvSet(env, num_envs)
        self.num_envs = self.envs.count
        self.max_steps = max_steps

    async def on_stop(self) -> None:
        """Close the environments."""
        self.envs.close()

    def to_state(self, observation: Any) -> torch.Tensor:
        """An environment's observation as the tensor the policy takes, in the environment's own dtype.

        Pixels stay uint8 (a quarter of float32's bytes in every batch and
        message): the policy casts them in its forward. The one change is
        float64, NumPy's default, which becomes torch's default float dtype
        (float32), as a tensor built from a list of floats would.
        """
        state = torch.as_tensor(observation)
        return state.to(torch.get_default_dtype()) if state.dtype == torch.float64 else state

    def to_env(self, action: Any) -> Any:
        """An action as the environment takes it: a number, or a tensor as a NumPy array (from any device)."""
        return action.numpy(force=True) if isinstance(action, torch.Tensor) else action


def state_dtype(observation: Any) -> Any:
    """The NumPy dtype :meth:`EnvPlayer.to_state` gives ``observation``: its own, float64 as torch's default float."""
    dtype = numpy.asarray(observation).dtype
    return numpy.dtype(str(torch.get_default_dtype()).removeprefix("torch.")) if dtype == numpy.float64 else dtype
