"""Hydra search-path plugin: makes the repository's sweeps/ folder the config group `sweeps`, so
`python -m ablate +sweeps=c3_no_sync` finds sweeps/c3_no_sync.yaml (from `python -m ablate`, the
compose API and hydra-submitit-launcher alike)."""
from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin


class AblateSweepsSearchPath(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        from ablate import SWEEPS_DIR

        search_path.append(provider="ablate-sweeps", path=f"file://{SWEEPS_DIR.parent}")
