"""Rich display of modules: the notebook tree (`Module._repr_html_`), treescope's
(`Module.__treescope_repr__`) and `boxwood.summary`. See README.md in this folder."""

from ._html import module_html as module_html
from ._html import notebook_html as notebook_html
from ._html import overview as overview
from ._summary import Summary as Summary
from ._summary import SummaryRow as SummaryRow
from ._summary import summary as summary
from ._treescope import treescope_repr as treescope_repr
from ._walk import FOLD_AT as FOLD_AT
from ._walk import FOLD_HEAD as FOLD_HEAD
from ._walk import human_bytes as human_bytes
