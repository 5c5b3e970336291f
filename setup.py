import ast
import importlib.util
import re
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

VERSION = re.search(r'^__version__ = "([^"]+)"', (Path(__file__).parent / "trialkit" / "__init__.py").read_text(),
                    re.M).group(1)

# scripts/ and launchers/ sit at the top of the checkout (users and images read
# them there) and ship inside the package as data.
PACKAGES = [
    "trialkit",
    "trialkit.adaptdl",
    "trialkit.adaptdl.boot",
    "trialkit.checkpoints",
    "trialkit.shims",
    "trialkit.shims.boot",
    "trialkit.shims.nni",
    "trialkit.shims.determined",
    "trialkit.shims.determined.core",
    "trialkit.shims.determined.launch",
    "trialkit.keeper",
    "trialkit.launch",
    "trialkit.control",
    "trialkit.manager",
    "trialkit.platforms",
    "trialkit.platforms.kubernetes",
    "trialkit.ray",
    "trialkit.web",
    "trialkit.scripts",
    "trialkit.launchers",
]

# trialkit's fallback packages (trialkit/shims: `nni`, ...) in every Python that has trialkit, for NNI's
# notebooks (`from nni.experiment import Experiment`): a .pth in site-packages appends, at each interpreter's
# start, a finder that answers only those names where no one else found them (a real nni always wins) and
# loads trialkit (FallbackFinder, trialkit/shims/boot) only when asked. Costs a start one class, no import.
PTH = "trialkit-fallbacks.pth"


def fallback_pth() -> str:
    boot_py = Path(__file__).parent / "trialkit" / "shims" / "boot" / "sitecustomize.py"
    spec = importlib.util.spec_from_file_location("trialkit_boot", boot_py)
    boot = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(boot)  # not as `sitecustomize`: defines, installs nothing
    # A folder named trialkit beside a user's script must not be taken for trialkit (NotANamespaceFinder): its
    # source, run at the start, as trialkit itself cannot be imported to find trialkit.
    source = boot_py.read_text()
    finder = next(node for node in ast.parse(source).body if getattr(node, "name", "") == "NotANamespaceFinder")
    not_a_namespace = (ast.get_source_segment(source, finder) + "\nsys.meta_path.insert(sys.meta_path.index("
                       "importlib.machinery.PathFinder), NotANamespaceFinder())\n")
    # Once: site may read a .pth twice (a venv's lib64 link to lib).
    return ('import sys; any(type(f).__name__ == "TrialkitFallbacks" for f in sys.meta_path) or sys.meta_path.append('
            'type("TrialkitFallbacks", (), {"names": %r, "find_spec": lambda self, name, path=None, target=None: '
            '__import__("trialkit.shims.boot.sitecustomize", fromlist=["_"]).FallbackFinder(self.names)'
            '.find_spec(name) if path is None and name in self.names else None})())\n'
            'import sys, importlib.machinery; any(type(f).__name__ == "NotANamespaceFinder" for f in sys.meta_path) '
            'or exec(%r, {"sys": sys, "importlib": importlib})\n'
            % (tuple(boot.fallback_names()), not_a_namespace))


class BuildWithPth(build_py):
    """Writes the .pth beside the packages: site-packages' top, in a wheel and in an editable install."""

    def run(self):
        super().run()
        # An editable install's wheel is made from install's install_lib, not build_lib (setuptools' editable_wheel).
        top = Path(self.get_finalized_command("install").install_lib if self.editable_mode else self.build_lib)
        top.mkdir(parents=True, exist_ok=True)
        (top / PTH).write_text(fallback_pth())


EXTRAS = {
    "torch": ["torch==2.13.0"],
    "deepspeed": ["deepspeed==0.19.8"],
    "adaptdl": ["adaptdl==0.2.11", "setuptools<81", "semver<3"],
    "ray": ["ray[default]==2.60.0"],
    # Ray Train (pandas, pyarrow, ...): bench/bench_ray_rescale.py races adaptdl-ray against its elastic mode.
    "ray-train": ["ray[default,train]==2.60.0"],
    "kubernetes": ["kubernetes>=30"],
    # aiohttp: the manager's server (trialkit/manager/transport.py); orjson: its decoder of the keepers' batches
    # (trialkit/manager/server.py's decode, which reads as records.loads without it). Keepers load neither.
    # optuna < 6: TPE's arguments that keep NNI's univariate search (multivariate=False) are the ones 4.x and 5.x take;
    # 6.0 removes those deprecated in 4.9, and a major version no test here has run may change more.
    "control": ["optuna>=4,<6", "matplotlib>=3.8", "pathspec>=0.12", "tensorboardX>=2.6", "plotly>=5", "aiohttp>=3.9",
                "orjson>=3.9"],
    # The searches that model results (trialkit/control/tuners): BOHB's kernel densities (statsmodels, as NNI's BOHB),
    # GP's Gaussian process (scikit-learn, as NNI's GPTuner), CMA-ES (cmaes, what optuna's CmaEsSampler runs). A config
    # naming one of them without it installed says to install this extra. statsmodels 0.15 takes the KDE's rng.
    "search": ["statsmodels>=0.15", "scikit-learn>=1.3", "cmaes>=0.10"],
    # The manager's GET /metrics in Prometheus' text format (trialkit/manager/metrics.py).
    "metrics": ["prometheus_client>=0.17"],
    # Checkpoints in object storage (S3 and S3-compatible, GCS, Azure Blob: trialkit/checkpoints/store.py): one
    # wheel with no dependencies (the demo installs `control` alone, so neither this nor the others).
    "checkpoints": ["obstore>=0.12"],
    # The user guide (docs/, mkdocs.yml): built in strict mode by tests/test_docs.py.
    "docs": ["mkdocs>=1.6", "mkdocstrings[python]>=0.26"],
}
EXTRAS["all"] = sorted({req for reqs in EXTRAS.values() for req in reqs})
EXTRAS["test"] = [
    "pytest>=8",
    "pytest-timeout>=2.3",
    # ./bootstrap.sh test runs the suite in several workers.
    "pytest-xdist>=3.8",
    "hypothesis>=6.100",
    "kubernetes-validate>=1.30",
    "jsonschema>=4",
    "selenium>=4.20",
    "numpy",
    # The checkpoint tests' S3 server (tests/s3_server.py): moto's standalone server, on loopback.
    "moto[server]>=5",
]

setup(
    name="trialkit",
    version=VERSION,
    description="A trial runtime for deep-learning training and a lean control plane for hyperparameter experiments",
    python_requires=">=3.9",
    packages=PACKAGES,
    package_dir={
        "trialkit": "trialkit",
        "trialkit.scripts": "scripts",
        "trialkit.launchers": "launchers",
    },
    package_data={"trialkit.scripts": ["*.sh"], "trialkit.launchers": ["*.yaml"], "trialkit.web": ["static/*", "vendor/*"]},
    install_requires=["psutil>=5.9", "requests>=2.28", "PyYAML>=6"],
    extras_require=EXTRAS,
    cmdclass={"build_py": BuildWithPth},
    entry_points={
        "console_scripts": [
            "trialkit=trialkit.cli:main",
            "trialkit-keeper=trialkit.keeper.main:main",
            "adaptdl-ray=trialkit.ray.adaptdl_ray:main",
        ]
    },
)
