"""The page's inline stylesheet: the report opens from the outbox with no fonts or files to fetch."""

from __future__ import annotations

__all__ = ["PAGE_CSS"]

PAGE_CSS = """
:root{color-scheme:light;--fg:#1d232a;--muted:#5b6570;--line:#d9dee3}
*{box-sizing:border-box}
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;color:var(--fg);
 margin:0 auto;padding:20px 28px 40px;max-width:1200px;background:#fff}
h1{font-size:24px;margin:0 0 6px}h2{font-size:18px;margin:26px 0 8px;border-bottom:1px solid var(--line);padding-bottom:4px}
code{font:13px ui-monospace,"DejaVu Sans Mono",monospace;overflow-wrap:anywhere}
.facts{display:grid;grid-template-columns:repeat(auto-fill,minmax(260px,1fr));gap:6px 18px;margin:10px 0 0}
.facts div{border-left:3px solid var(--line);padding:2px 8px}.facts dt{color:var(--muted);font-size:12px}
.facts dd{margin:0;font-weight:600}
.status{display:inline-block;padding:2px 10px;border-radius:12px;color:#fff;font-weight:700;font-size:13px}
.status-compiled,.status-verified{background:#2e7d32}.status-not_compiled,.status-planned{background:#1565c0}
.status-failed,.status-does_not_fit{background:#c62828}
.status-not_proven{background:#ef6c00}
.devices{display:grid;grid-template-columns:1fr;gap:2px}
figure{margin:4px 0}figcaption{font-size:13px;color:var(--muted)}figcaption b{color:var(--fg)}
svg{max-width:100%;height:auto;font-family:inherit;display:block}
svg text{font-size:13px;fill:var(--fg)}svg .small{font-size:12px}svg .tiny{font-size:11px;fill:var(--muted)}
svg .on-colour{fill:#fff;font-weight:600}
.legend span{display:inline-block;margin-right:14px;font-size:13px}
.legend i{display:inline-block;width:12px;height:12px;margin-right:5px;vertical-align:-1px;border-radius:2px}
table{border-collapse:collapse;font-size:13px;margin:6px 0}
th,td{border:1px solid var(--line);padding:3px 8px;text-align:left;vertical-align:top}th{background:#f3f5f7}
td.num{text-align:right;font-variant-numeric:tabular-nums}
.ok{color:#2e7d32;font-weight:700}.bad{color:#c62828;font-weight:700}
.error{border:2px solid #c62828;background:#fff4f4;padding:2px 14px 8px;border-radius:4px;margin-top:18px}
.tag{display:inline-block;font-size:11px;padding:0 6px;margin-right:6px;border-radius:8px;background:#eceff1}
.charts{display:flex;flex-wrap:wrap;gap:10px 28px}
footer{margin-top:30px;color:var(--muted);font-size:12px}
"""
