"""One IPPO pipeline stage's compiled programs are built once per process for equal settings and
mixture (jaxlake.students.stage.compiled): the stages of a run that train the same mixture, and
the runs of a sweep in one process, reuse them instead of compiling again."""

from jaxlake import LakeConfig
from jaxlake.mixture import Mixture
from jaxlake.students.config import IPPOConfig
from jaxlake.students.stage import KEEP_BUILT, compiled

SMALL = IPPOConfig(num_envs=2, num_steps=4, num_updates=1, update_epochs=1, num_minibatches=1, hidden=(8,),
                   pool_lakes=4, eval_every=1, eval_lakes=2)
A = LakeConfig(height=4, width=4, num_agents=1, hole_density=0.0, max_steps=8, max_height=4, max_width=4, max_agents=2)
B = LakeConfig(**{**A.to_dict(), "hole_density": 0.2})


def test_equal_settings_and_mixture_reuse_the_compiled_trainer():
    first = compiled(SMALL, Mixture.of(A))
    again = compiled(SMALL, Mixture([(1.0, LakeConfig(**A.to_dict()))]))  # equal, built apart
    assert again is first
    assert compiled(SMALL, Mixture.of(B)) is not first  # another mixture
    assert compiled(SMALL, Mixture([(0.5, A), (0.5, B)])) is not first
    other = IPPOConfig(**{**{f: getattr(SMALL, f) for f in SMALL.__dataclass_fields__}, "num_updates": 2})
    assert compiled(other, Mixture.of(A)) is not first  # other settings


def test_only_the_most_recent_are_kept():
    first = compiled(SMALL, Mixture.of(A))
    for h in range(KEEP_BUILT):
        compiled(SMALL, Mixture.of(LakeConfig(**{**A.to_dict(), "max_steps": 9 + h})))
    assert compiled(SMALL, Mixture.of(A)) is not first
