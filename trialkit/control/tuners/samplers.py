"""Model-based and low-discrepancy samplers: NNI's GP tuner, CMA-ES, and quasi-random (Sobol, Halton) points.

Each searches the unit cube: a numeric parameter is its unit coordinate
(searchspace.Numeric: a log-uniform one on its log scale, a normal one through
its CDF), a choice the option whose share of [0, 1] holds the coordinate. A
trial's point in the cube is read back from its stored parameters, so the
uninterrupted tuner and one rebuilt from the store (`replay`) hold the same
points. Each needs a library of trialkit's `search` extra: scikit-learn (GP, as
NNI's GPTuner), cmaes (CMA-ES, the implementation optuna's CmaEsSampler runs),
scipy (Sobol and Halton sequences, what optuna's QMCSampler draws).
"""
from __future__ import annotations

import math
import random
import warnings
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from trialkit import schema
from trialkit.control.searchspace import Choice, Nested, SearchSpace
from trialkit.control.tuners.base import Tuner, check_flat, check_mode, check_positive, check_seed, derived_seed
from trialkit.errors import UserError

Path = Tuple[str, ...]


def unit_vector(space: SearchSpace, params: Mapping[str, Any]) -> List[float]:
    """A flat space's point as unit coordinates (a choice: the middle of its option's share)."""
    return [(param.index_of(params[key]) + 0.5) / len(param.options) if isinstance(param, Choice)
            else param.to_unit(params[key]) for key, param in space.params.items()]


def from_units(space: SearchSpace, units: Mapping[Path, float], prefix: Path = ()) -> Dict[str, Any]:
    """The point whose coordinates `units` holds, by each parameter's path (a nested option's parameters
    under (choice, option name))."""
    out = {}
    for key, param in space.params.items():
        u = min(max(float(units[prefix + (key,)]), 0.0), 1.0)
        if isinstance(param, Choice):
            index = min(int(u * len(param.options)), len(param.options) - 1)
            name = getattr(param.options[index], "name", None)
            out[key] = param.value_at(index, lambda sub: from_units(sub, units, prefix + (key, name)))
        else:
            out[key] = param.from_unit(u)
    return out


def paths(space: SearchSpace, prefix: Path = ()) -> List[Path]:
    """Every parameter's path, nested options' included: the cube's axes."""
    out = []
    for key, param in space.params.items():
        out.append(prefix + (key,))
        if isinstance(param, Choice):
            for option in param.options:
                if isinstance(option, Nested):
                    out += paths(option.space, prefix + (key, option.name))
    return out


def flat_units(space: SearchSpace, vector: Sequence[float]) -> Dict[Path, float]:
    return {(key,): float(u) for key, u in zip(space.params, vector)}


# ---------------------------------------------------------------- GP


def _utility(value: Any, where: str) -> str:
    return schema.as_choice(value, ("ei", "ucb", "poi"), where)


class GPTuner(Tuner):
    """NNI's GP tuner (gp_tuner.py): random points until cold_start_num results are in, then the point that
    maximizes the utility (ei, ucb or poi, with kappa and xi) under scikit-learn's Gaussian process (a Matern
    kernel of `nu`, noise `alpha`, normalized targets, 25 restarts of its fit), found as NNI finds it: the best
    of selection_num_warm_up random points, then L-BFGS-B from selection_num_starting_points random starts.
    NNI's classArgs and defaults; the model is fitted on the unit cube rather than on raw values (a log-uniform
    parameter on its log scale)."""

    ARGS = {
        "optimize_mode": check_mode,
        "utility": _utility,
        "kappa": lambda v, w: schema.as_number(v, w, minimum=0),
        "xi": lambda v, w: schema.as_number(v, w, minimum=0),
        "nu": check_positive,
        "alpha": lambda v, w: schema.as_number(v, w, minimum=0),
        "cold_start_num": lambda v, w: schema.as_int(v, w, minimum=1),
        "selection_num_warm_up": lambda v, w: schema.as_int(v, w, minimum=1),
        "selection_num_starting_points": lambda v, w: schema.as_int(v, w, minimum=0),
        "seed": check_seed,
    }
    NEEDS = ("sklearn", "scipy", "numpy")

    def __init__(self, space: SearchSpace, optimize_mode: str, seed: int, class_args: Mapping[str, Any]):
        super().__init__(space, optimize_mode, seed, class_args)
        self.args = {"utility": "ei", "kappa": 5.0, "xi": 0.0, "nu": 2.5, "alpha": 1e-6, "cold_start_num": 10,
                     "selection_num_warm_up": 100000, "selection_num_starting_points": 250, **class_args}
        self._results: Dict[int, float] = {}  # parameter id -> final value, for points of this space

    @classmethod
    def check_space(cls, space: SearchSpace) -> None:
        check_flat(space, "GP", "TPE")

    def _propose(self, parameter_id: int, rng: random.Random) -> Dict[str, Any]:
        if len(self._results) < self.args["cold_start_num"]:
            return self.space.sample(rng)
        from threadpoolctl import threadpool_limits  # scikit-learn's own dependency

        # BLAS' threads on matrices this small (a row per result) only wait on each other: each L-BFGS-B step
        # took 1.6 ms with them at load 10, against 0.1 ms in one thread (bench/gp_pick.py)
        with threadpool_limits(limits=1):
            return self._best_point(rng)

    def _best_point(self, rng: random.Random) -> Dict[str, Any]:
        import numpy
        from scipy.optimize import minimize

        state = numpy.random.RandomState(rng.getrandbits(32))
        sign = 1.0 if self.optimize_mode == "maximize" else -1.0  # the GP maximizes, as NNI's
        ids = sorted(self._results)
        x = numpy.array([unit_vector(self.space, self._params[pid]) for pid in ids])
        y = numpy.array([sign * self._results[pid] for pid in ids])
        model = _Posterior(x, y, self.args, state)
        acquisition = _acquisition(self.args, model, float(y.max()))
        dims = len(self.space.params)
        tries = state.uniform(size=(self.args["selection_num_warm_up"], dims))
        values = acquisition(tries)
        best, best_value = tries[values.argmax()], float(values.max())
        bounds = [(0.0, 1.0)] * dims
        for start in state.uniform(size=(self.args["selection_num_starting_points"], dims)):
            self._check_abandoned()
            found = minimize(_with_gradient(acquisition), start, jac=True, bounds=bounds, method="L-BFGS-B")
            if found.success and -float(found.fun) >= best_value:
                best, best_value = found.x, -float(found.fun)
        return from_units(self.space, flat_units(self.space, numpy.clip(best, 0.0, 1.0)))

    def _completed(self, parameter_id: int, value: float) -> None:
        if self.space.contains(self._params[parameter_id]):
            self._results[parameter_id] = value


def _acquisition(args: Mapping[str, Any], gp: Any, y_max: float) -> Any:
    """NNI's UtilityFunction: the utility of points (rows) under `gp`."""
    import numpy
    from scipy.stats import norm

    def utility(points: Any) -> Any:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mean, std = gp.predict(points, return_std=True)
        if args["utility"] == "ucb":
            return mean + args["kappa"] * std
        std = numpy.maximum(std, 1e-9)
        z = (mean - y_max - args["xi"]) / std
        if args["utility"] == "poi":
            return norm.cdf(z)
        return (mean - y_max - args["xi"]) * norm.cdf(z) + std * norm.pdf(z)

    return utility


class _Posterior:
    """scikit-learn's Gaussian process (normalize_y, as NNI's), fitted once; its posterior at many points in
    one numpy pass. GaussianProcessRegressor.predict checks its input on every call, which cost most of a
    pick when L-BFGS-B asked one point at a time (about 9,000 calls per pick)."""

    def __init__(self, x: Any, y: Any, args: Mapping[str, Any], state: Any):
        import numpy
        from scipy.linalg import solve_triangular
        from sklearn.gaussian_process import GaussianProcessRegressor
        from sklearn.gaussian_process.kernels import Matern

        # normalize_y=True's scaling, done here so that the posterior below can undo it
        self.mean, self.scale = float(y.mean()), float(y.std()) or 1.0
        gp = GaussianProcessRegressor(kernel=Matern(nu=args["nu"]), alpha=args["alpha"], n_restarts_optimizer=25,
                                      random_state=state)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # scikit-learn's convergence warnings, as NNI silences them
            gp.fit(x, (y - self.mean) / self.scale)
        self.kernel, self.x, self.weights = gp.kernel_, gp.X_train_, gp.alpha_
        # L^-1 once: a small triangular solve per call cost 10 times a product with it (BLAS' threads)
        self.inverse = solve_triangular(gp.L_, numpy.eye(len(x)), lower=True, check_finite=False)
        self._numpy = numpy

    def predict(self, points: Any, return_std: bool = True) -> Tuple[Any, Any]:
        """The mean and standard deviation at each point (row), as GaussianProcessRegressor.predict gives."""
        numpy = self._numpy
        cross = self.kernel(points, self.x)
        mean = cross @ self.weights
        v = self.inverse @ cross.T
        variance = numpy.maximum(self.kernel.diag(points) - numpy.einsum("ij,ij->j", v, v), 0.0)
        return self.scale * mean + self.mean, self.scale * numpy.sqrt(variance)


def _with_gradient(acquisition: Any) -> Any:
    """-acquisition at a point and its forward-difference gradient (scipy's default step), from one call on
    the point and its dims neighbours: L-BFGS-B's minus-utility with its jacobian."""
    import numpy

    def value_and_gradient(point: Any) -> Tuple[float, Any]:
        step = 1.4901161193847656e-08 * numpy.maximum(1.0, numpy.abs(point))  # sqrt(float64 eps), scipy's
        step = numpy.where(point + step > 1.0, -step, step)  # inside the cube, as scipy's bounded differences
        values = acquisition(numpy.vstack([point, point + numpy.diag(step)]))
        return -float(values[0]), -(values[1:] - values[0]) / step

    return value_and_gradient


# ---------------------------------------------------------------- CMA-ES


class CmaEsTuner(Tuner):
    """CMA-ES (the `cmaes` library optuna's CmaEsSampler runs; Katib's cmaes): generations of `popsize`
    points from a normal distribution over the unit cube whose mean, step size (`sigma0` at first, 1/6 as
    optuna's) and covariance the generation before moved towards its better points. Generation g is parameter
    ids g * popsize to (g + 1) * popsize - 1; it starts once each trial of the one before ended (a failed one
    counts as the worst), so what it learnt is a function of the results, not of their order. classArgs
    (optuna's names): sigma0, popsize, use_separable_cma, lr_adapt, optimize_mode, seed."""

    ARGS = {
        "optimize_mode": check_mode,
        "sigma0": check_positive,
        "popsize": lambda v, w: schema.as_int(v, w, minimum=2),
        "use_separable_cma": schema.as_bool,
        "lr_adapt": schema.as_bool,
        "seed": check_seed,
    }
    NEEDS = ("cmaes", "numpy")

    def __init__(self, space: SearchSpace, optimize_mode: str, seed: int, class_args: Mapping[str, Any]):
        super().__init__(space, optimize_mode, seed, class_args)
        import numpy

        dims = len(space.params)
        self.popsize: int = class_args.get("popsize", 4 + math.floor(3 * math.log(dims)))  # CMA-ES's default
        options = {"mean": numpy.full(dims, 0.5), "sigma": class_args.get("sigma0", 1 / 6),
                   "bounds": numpy.array([[0.0, 1.0]] * dims), "seed": seed, "population_size": self.popsize}
        if class_args.get("use_separable_cma"):
            from cmaes import SepCMA

            self._cma = SepCMA(**options)
        else:
            from cmaes import CMA

            self._cma = CMA(**options, lr_adapt=bool(class_args.get("lr_adapt")))
        self._results: Dict[int, float] = {}
        self._told = 0  # generations the distribution learnt from

    @classmethod
    def check_space(cls, space: SearchSpace) -> None:
        check_flat(space, "CMA-ES", "TPE")

    @classmethod
    def check_class_args(cls, args: Dict[str, Any], where: str) -> None:
        if args.get("use_separable_cma") and args.get("lr_adapt"):
            raise UserError("lr_adapt is not available with use_separable_cma", schema.path(where, "lr_adapt"),
                            "keep one of them: cmaes' SepCMA adapts no learning rate")

    def _generation_done(self, generation: int) -> bool:
        first = generation * self.popsize
        return all(pid in self._finished for pid in range(first, first + self.popsize))

    def _propose(self, parameter_id: int, rng: random.Random) -> Optional[Dict[str, Any]]:
        generation = parameter_id // self.popsize
        while self._told < generation:
            if not self._generation_done(self._told):
                return None  # the generation before is still running
            self._learn(self._told)
            self._told += 1
        self._cma.reseed_rng(derived_seed(self.seed, parameter_id))
        return from_units(self.space, flat_units(self.space, self._cma.ask()))

    def _learn(self, generation: int) -> None:
        import numpy

        sign = -1.0 if self.optimize_mode == "maximize" else 1.0  # cmaes minimizes
        first = generation * self.popsize
        ids = range(first, first + self.popsize)
        losses = {pid: sign * self._results[pid] for pid in ids if pid in self._results}
        worst = max(losses.values(), default=0.0) + 1.0  # a failed trial: worse than every result
        self._cma.tell([(numpy.array(unit_vector(self.space, self._params[pid])), losses.get(pid, worst))
                        for pid in ids])

    def _completed(self, parameter_id: int, value: float) -> None:
        self._results[parameter_id] = value

    @property
    def waiting(self) -> bool:
        return any(pid not in self._finished for pid in self._params)


# ---------------------------------------------------------------- quasi-random


class QmcTuner(Tuner):
    """optuna's QMCSampler: the points of a low-discrepancy sequence (qmc_type sobol or halton, scipy's), the
    k-th for parameter id k, so the first trials cover the space evenly. `scramble` randomizes the sequence by
    the seed (without it the sequence is the same for every seed, and a seed is refused)."""

    ARGS = {
        "optimize_mode": check_mode,
        "qmc_type": lambda v, w: schema.as_choice(v, ("sobol", "halton"), w),
        "scramble": schema.as_bool,
        "seed": check_seed,
    }
    NEEDS = ("scipy",)
    KIND = ""  # a fixed sequence (Sobol); "" takes qmc_type

    def __init__(self, space: SearchSpace, optimize_mode: str, seed: int, class_args: Mapping[str, Any]):
        super().__init__(space, optimize_mode, seed, class_args)
        self.kind: str = self.KIND or class_args.get("qmc_type", "sobol")
        self.scramble: bool = class_args.get("scramble", False)  # optuna's default
        self._axes = paths(space)

    @classmethod
    def check_class_args(cls, args: Dict[str, Any], where: str) -> None:
        if "seed" in args and not args.get("scramble", False):
            raise UserError("seed without scramble: true changes nothing (an unscrambled sequence is the same for "
                            "every seed)", schema.path(where, "seed"), "add scramble: true, or remove the seed")

    def _propose(self, parameter_id: int, rng: random.Random) -> Dict[str, Any]:
        from scipy.stats import qmc

        engine = (qmc.Sobol if self.kind == "sobol" else qmc.Halton)(
            d=len(self._axes), scramble=self.scramble, seed=self.seed if self.scramble else None)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Sobol's note that its balance needs 2^m points
            if parameter_id:  # scipy's Sobol cannot skip nothing (1.17: an OverflowError)
                engine.fast_forward(parameter_id)
            units = engine.random(1)[0]
        return from_units(self.space, dict(zip(self._axes, units)))


class SobolTuner(QmcTuner):
    """Katib's sobol: optuna's QMCSampler with the Sobol sequence."""

    ARGS = {"optimize_mode": check_mode, "scramble": schema.as_bool, "seed": check_seed}
    KIND = "sobol"
