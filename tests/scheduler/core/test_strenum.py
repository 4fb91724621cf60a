"""The contract's states are built on scheduler/core/contract/strenum.py, not on the enum
module (the Slurm commands start without it), while the type checker is shown
`enum.StrEnum`. So the same class bodies (contract/states.py's own source) are built here
on `enum.StrEnum` too, and the two are held to the same behaviours; and what the enum
version pickled (a Raft snapshot holds jobs' states) loads as the same members, and is
what the light version writes."""

from __future__ import annotations

import copy
import enum
import json
import pickle
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from scheduler.core.contract import states
from scheduler.core.contract.states import JobState, StateKind
from scheduler.core.contract.strenum import LightStrEnum

LIGHT_IMPORT = "from scheduler.core.contract.strenum import StrEnum\n"


@pytest.fixture(scope="module")
def as_enum() -> ModuleType:
    """contract/states.py, its classes built on `enum.StrEnum`."""
    source = Path(states.__file__).read_text()
    assert source.count(LIGHT_IMPORT) == 1
    module = ModuleType("states_as_enum")
    code = compile(source.replace(LIGHT_IMPORT, "from enum import StrEnum\n"), "as_enum", "exec")
    exec(code, module.__dict__)  # noqa: S102 - the project's own source
    assert issubclass(module.JobState, enum.StrEnum)
    return module


def behaviour(cls: Any) -> list[Any]:
    """What the code and its libraries read of the states, as plain data."""
    out: list[Any] = [len(cls), [m.name for m in cls], [m.value for m in cls]]
    for member in cls:
        out += [
            member == member.value,
            type(member.value) is str,
            isinstance(member, str),
            str(member),
            f"{member}|{member:>12}|{member!r}",
            "%s" % member,  # noqa: UP031 - the old way prints it too
            hash(member) == hash(member.value),
            cls(member.value) is member,
            cls(member) is member,
            cls[member.name] is member,
            getattr(cls, member.name) is member,
            {member.value: 1}.get(member),
            copy.copy(member) is member,
            copy.deepcopy({"s": member})["s"] is member,
            json.dumps({"s": member}),
            member in cls,
            member.upper(),
            member < "Q",
        ]
        if cls.__name__ == "JobState":
            out += [
                member.code,
                member.label,
                member.kind.value,
                member.is_active,
                member.is_terminal,
                member.holds_resources,
            ]
    for unknown in ("pending", "", "NOPE"):
        with pytest.raises(ValueError) as caught:
            cls(unknown)
        out.append(str(caught.value))
    with pytest.raises(KeyError):
        cls["NOPE"]
    return out


@pytest.mark.parametrize("name", ["JobState", "StateKind"])
def test_the_states_behave_as_the_same_enum_would(as_enum: ModuleType, name: str) -> None:
    light = getattr(states, name)
    assert issubclass(light, LightStrEnum) and not issubclass(light, enum.Enum)
    assert behaviour(light) == behaviour(getattr(as_enum, name))
    assert {s.value for s in states.ACTIVE} == {s.value for s in as_enum.ACTIVE}


# `pickle.dumps([*JobState, *StateKind], protocol=p)` as the enum version (before
# contract/strenum.py) wrote it: pysyncobj pickles with protocol 2, pickle's default is 4.
ENUM_PICKLES = {
    2: bytes.fromhex(
        "80025d710028637363686564756c65722e636f72652e636f6e74726163742e7374617465730a4a6f62537461"
        "74650a7101580700000050454e44494e4771028571035271046801580700000052554e4e494e477105857106"
        "5271076801580a000000434f4d504c4554494e47710885710952710a6801580900000053555350454e444544"
        "710b85710c52710d68015809000000434f4d504c45544544710e85710f5271106801580900000043414e4345"
        "4c4c45447111857112527113680158060000004641494c454471148571155271166801580700000054494d45"
        "4f55547117857118527119680158090000004e4f44455f4641494c711a85711b52711c680158090000005052"
        "45454d50544544711d85711e52711f6801580d0000004f55545f4f465f4d454d4f5259712085712152712263"
        "7363686564756c65722e636f72652e636f6e74726163742e7374617465730a53746174654b696e640a712358"
        "0700000077616974696e6771248571255271266823580700000072756e6e696e677127857128527129682358"
        "09000000737563636565646564712a85712b52712c682358060000006661696c6564712d85712e52712f6823"
        "580700000073746f707065647130857131527132652e"
    ),
    4: bytes.fromhex(
        "80049552010000000000005d94288c1e7363686564756c65722e636f72652e636f6e74726163742e73746174"
        "6573948c084a6f6253746174659493948c0750454e44494e47948594529468038c0752554e4e494e47948594"
        "529468038c0a434f4d504c4554494e47948594529468038c0953555350454e444544948594529468038c0943"
        "4f4d504c45544544948594529468038c0943414e43454c4c4544948594529468038c064641494c4544948594"
        "529468038c0754494d454f5554948594529468038c094e4f44455f4641494c948594529468038c0950524545"
        "4d50544544948594529468038c0d4f55545f4f465f4d454d4f5259948594529468018c0953746174654b696e"
        "649493948c0777616974696e67948594529468268c0772756e6e696e67948594529468268c09737563636565"
        "646564948594529468268c066661696c6564948594529468268c0773746f707065649485945294652e"
    ),
}


@pytest.mark.parametrize("protocol", sorted(ENUM_PICKLES))
def test_what_the_enum_version_pickled_loads_as_the_same_members(protocol: int) -> None:
    members = [*JobState, *StateKind]
    loaded = pickle.loads(ENUM_PICKLES[protocol])
    assert len(loaded) == len(members)
    assert all(a is b for a, b in zip(loaded, members, strict=True))
    # And it is what this version writes: a snapshot loads in either.
    assert pickle.dumps(members, protocol=protocol) == ENUM_PICKLES[protocol]


def test_a_class_body_with_a_value_twice_is_an_error() -> None:
    with pytest.raises(ValueError, match="B: 'a' is not a new str value"):

        class Twice(LightStrEnum):
            A = "a"
            B = "a"
