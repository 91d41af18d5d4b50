"""Runtime properties: typed, validated knobs whose reloadable ones change while running.

This module owns the property model:

* [`PropertyDefinition`][decaton_aio.properties.PropertyDefinition] - what a knob is: name,
  default, parser, validator, whether it is reloadable, a one-line doc. Immutable; built-in
  ones are module constants collected in `BUILTIN_DEFINITIONS`. Defined with the built-ins
  and the documentation's table in `decaton_aio.properties._definitions`.
* [`Property`][decaton_aio.properties.Property] - the live value of one definition inside
  one runtime, with listeners that run after each change.
* [`Properties`][decaton_aio.properties.Properties] - every live property of one runtime.
  Building it is *strict* (an unknown name or a bad value raises
  [`ConfigError`][decaton_aio.errors.ConfigError]); changing it later is *lenient* (a bad
  value is logged and rejected, the old one kept).

Where new values come from (files, a Kafka topic, environment variables) lives in
`decaton_aio.properties._sources`.

Ownership: properties are read and changed on the event loop that runs the processor.
Nothing here locks; do not call [`Property.set()`][decaton_aio.properties.Property.set] from
another thread.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Final, Generic, TypeVar, cast, overload

import structlog

from decaton_aio.errors import ConfigError
from decaton_aio.properties._definitions import BUILTIN_DEFINITIONS, PropertyDefinition

__all__ = ["RESET", "Layer", "Listener", "Properties", "Property"]

T = TypeVar("T")

Listener = Callable[[T, T], None]
"""A change listener: called with ``(old, new)`` right after a property changed."""

_log = structlog.get_logger("decaton_aio.properties")


class _Reset:
    """Type of `RESET`."""

    def __repr__(self) -> str:
        return "RESET"


RESET: Final = _Reset()
"""A value for `Properties.update()` meaning "back to the value it had at start"."""


class _Unset:
    pass


_UNSET: Final = _Unset()


class Property(Generic[T]):
    """The live value of one property, with listeners called after each change.

    Ownership: read and changed on the processor's event loop only.

    Args:
        definition: what this property is.
        value: the value at start, already converted; defaults to the definition's default.
    """

    __slots__ = ("_definition", "_initial", "_listeners", "_next_token", "_value")

    def __init__(self, definition: PropertyDefinition[T], value: T | _Unset = _UNSET) -> None:
        initial = definition.default if isinstance(value, _Unset) else value
        self._definition = definition
        self._initial: T = initial
        self._value: T = initial
        self._listeners: dict[int, Listener[T]] = {}
        self._next_token = 0

    def __repr__(self) -> str:
        return f"Property({self._definition.name}={self._value!r})"

    @property
    def definition(self) -> PropertyDefinition[T]:
        """What this property is."""
        return self._definition

    @property
    def name(self) -> str:
        """The property's name."""
        return self._definition.name

    @property
    def value(self) -> T:
        """The current value."""
        return self._value

    @property
    def initial(self) -> T:
        """The value at start; [`reset()`][decaton_aio.properties.Property.reset] goes back
        to it."""
        return self._initial

    def set(self, raw: object) -> bool:
        """Change the value, leniently: a rejected value is logged and the old one kept.

        Caller: a property source or user code, on the event loop.
        Affects: [`value`][decaton_aio.properties.Property.value]; then every listener, in
            subscription order.

        Args:
            raw: a string to parse, or a value from code or JSON.

        Returns:
            True when the value is now ``raw`` (changed, or already equal); False when it
            was rejected (cannot parse, not allowed, or the property is not reloadable).
        """
        definition = self._definition
        value, problem = definition._try_convert(raw)
        if problem is not None:
            _log.warning(
                "property value rejected; keeping the current value",
                property=definition.name,
                value=raw,
                allowed=definition.allowed,
                reason=f"{raw!r} {problem}",
                current=self._value,
            )
            return False
        return self._change(cast(T, value))

    def reset(self) -> bool:
        """Go back to the value at start (what a removed file line or a tombstone means).

        Returns:
            True when the value is now the initial one; False when refused.
        """
        return self._change(self._initial)

    def subscribe(self, listener: Listener[T]) -> Callable[[], None]:
        """Call ``listener(old, new)`` synchronously after every change.

        Listeners run in subscription order on the event loop; one that raises is logged
        and the others still run. A listener needing async work should schedule it
        (e.g. set an ``asyncio.Event`` or resize a limiter) rather than block.

        Args:
            listener: the callback.

        Returns:
            A handle; calling it unsubscribes (calling it again does nothing).
        """
        token = self._next_token
        self._next_token += 1
        self._listeners[token] = listener

        def unsubscribe() -> None:
            self._listeners.pop(token, None)

        return unsubscribe

    def _change(self, new: T) -> bool:
        old = self._value
        if new == old:
            return True
        definition = self._definition
        if not definition.reloadable:
            _log.warning(
                "property is not reloadable; restart the processor to change it",
                property=definition.name,
                value=new,
                current=old,
            )
            return False
        self._value = new
        _log.info("property changed", property=definition.name, old=old, new=new)
        # Copy: a listener may unsubscribe itself (or others) while we iterate.
        for listener in list(self._listeners.values()):
            try:
                listener(old, new)
            except Exception:
                _log.exception(
                    "property listener failed", property=definition.name, listener=listener
                )
        return True


Key = str | PropertyDefinition[Any]
Layer = Mapping[Any, object]
"""Name (or definition) to value. ``Any`` keys: a dict mixing both infers ``object`` keys."""


class Properties:
    """Every live property of one runtime.

    Building is strict: each layer maps names (or definitions) to values (strings are
    parsed); later layers override earlier ones, e.g.
    ``Properties(code_values, file_values, env_values, cli_values)``.

    Args:
        *layers: name-to-value mappings, lowest precedence first.
        definitions: the known definitions; defaults to `BUILTIN_DEFINITIONS`.
            Add your own with ``definitions=(*BUILTIN_DEFINITIONS, MY_DEFINITION)``.
        sources: where each layer's values come from, in the order of ``layers`` (e.g.
            ``"in the file app.properties"``): a problem found in a layer ends with its
            source in parentheses.

    Raises:
        ConfigError: a name is unknown (the message suggests the closest known name),
            a value is not allowed, or two definitions share a name. Every problem is
            listed in one message.
    """

    def __init__(
        self,
        *layers: Layer,
        definitions: Iterable[PropertyDefinition[Any]] = BUILTIN_DEFINITIONS,
        sources: Sequence[str] = (),
    ) -> None:
        self._definitions: dict[str, PropertyDefinition[Any]] = {}
        for definition in definitions:
            if definition.name in self._definitions:
                raise ConfigError(f"property {definition.name} is defined twice")
            self._definitions[definition.name] = definition
        problems: list[str] = []
        # Each layer's values, converted: a source that changes its layer later (a file
        # reload, a topic record) changes only what no higher layer overrides.
        self._layers: list[dict[str, object]] = []
        for index, layer in enumerate(layers):
            where = f" ({sources[index]})" if index < len(sources) else ""
            converted: dict[str, object] = {}
            for key, raw in layer.items():
                name = _name_of(key)
                found = self._definitions.get(name)
                if found is None:
                    problems.append(self._unknown(name) + where)
                    continue
                try:
                    converted[name] = found.convert(raw)
                except ConfigError as exc:
                    problems.append(str(exc) + where)
            self._layers.append(converted)
        if problems:
            raise ConfigError("; ".join(problems))
        initial: dict[str, object] = {}
        for converted in self._layers:
            initial.update(converted)
        self._properties: dict[str, Property[Any]] = {
            name: Property(definition, initial.get(name, definition.default))
            for name, definition in self._definitions.items()
        }

    @overload
    def __getitem__(self, key: PropertyDefinition[T]) -> Property[T]: ...

    @overload
    def __getitem__(self, key: str) -> Property[Any]: ...

    def __getitem__(self, key: Key) -> Property[Any]:
        """Return the live property for a definition (typed result) or a name.

        Raises:
            KeyError: the name is not known here.
        """
        name = _name_of(key)
        try:
            return self._properties[name]
        except KeyError:
            raise KeyError(self._unknown(name)) from None

    get = __getitem__
    """Same as ``props[key]``: the live property for a definition (typed) or a name."""

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str | PropertyDefinition) and _name_of(key) in self._properties

    def __iter__(self) -> Iterator[Property[Any]]:
        return iter(self._properties.values())

    def __len__(self) -> int:
        return len(self._properties)

    @property
    def definitions(self) -> tuple[PropertyDefinition[Any], ...]:
        """The known definitions."""
        return tuple(self._definitions.values())

    def snapshot(self) -> dict[str, Any]:
        """Return the current value of every property, by name."""
        return {name: prop.value for name, prop in self._properties.items()}

    def update(self, values: Layer, *, layer: int | None = None) -> dict[str, bool]:
        """Apply a batch of changes (a reload), leniently.

        Each entry is applied on its own: a rejected value or an unknown name is logged
        and skipped, the rest still apply.

        With ``layer`` (the index of a layer given at construction, which a property
        source reloads), the values replace that layer's: a property takes the value of
        the highest layer that sets it, so a file reload never overrides the environment
        or the command line, and `RESET` removes the name from the layer (the next
        layer down, or the default, applies). Without ``layer``, the values apply over
        every layer and `RESET` goes back to the value at start.

        Caller: property sources and user code, on the event loop.
        Affects: the named properties and their listeners.

        Args:
            values: name (or definition) to new value.
            layer: the layer the values replace, or ``None`` for over every layer.

        Returns:
            Name to whether it was accepted.
        """
        if layer is not None and not 0 <= layer < len(self._layers):
            raise ConfigError(f"layer {layer} does not exist: there are {len(self._layers)}")
        results: dict[str, bool] = {}
        for key, raw in values.items():
            name = _name_of(key)
            prop = self._properties.get(name)
            if prop is None:
                _log.warning("unknown property ignored", property=name, hint=self._unknown(name))
                results[name] = False
            elif layer is not None:
                results[name] = self._update_layer(prop, name, raw, layer)
            elif isinstance(raw, _Reset):
                results[name] = prop.reset()
            else:
                results[name] = prop.set(raw)
        return results

    def _update_layer(self, prop: Property[Any], name: str, raw: object, index: int) -> bool:
        # Caller: update. Affects: one layer's entry, then the property's value when that
        # layer is the highest one setting it.
        values = self._layers[index]
        before = values.get(name, _UNSET)
        if isinstance(raw, _Reset):
            values.pop(name, None)
        else:
            value, problem = prop.definition._try_convert(raw)
            if problem is not None:
                return prop.set(raw)  # logs the rejection the same way; nothing changes
            values[name] = value
        effective = next(
            (layer[name] for layer in reversed(self._layers) if name in layer),
            prop.definition.default,
        )
        if prop.set(effective):
            return True
        # Refused (not reloadable): the layer keeps what it had.
        if before is _UNSET:
            values.pop(name, None)
        else:
            values[name] = before
        return False

    def _unknown(self, name: str) -> str:
        close = difflib.get_close_matches(name, self._definitions, n=1, cutoff=0.6)
        if close:
            return f"unknown property {name!r}; did you mean {close[0]!r}?"
        return f"unknown property {name!r}; known properties: {', '.join(self._definitions)}"


def _name_of(key: object) -> str:
    if isinstance(key, PropertyDefinition):
        return key.name
    if isinstance(key, str):
        return key
    raise ConfigError(f"property keys are names or definitions, got {key!r}")
