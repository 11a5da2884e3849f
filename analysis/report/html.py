"""Render a :class:`analysis.report.doc.Document` as one self-contained HTML page.

Self-contained: CSS and one small script inline, figures as ``data:image/png;base64`` URIs, no
external assets (it opens offline). The script sorts a table when its header is clicked (by each
cell's ``data-sort`` value, numerically when both values are numbers, missing values last) and
pages long tables (``data-page-rows``). All text is HTML-escaped.
"""

from __future__ import annotations

import base64
from html import escape

from analysis.report.doc import Block, Document, Figure, Heading, Note, Paragraph, Section, Table

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;font-size:16px;
line-height:1.45;color:#1b1b1b;max-width:1600px;margin:0 auto;padding:1.5rem;background:#fff}
h1{font-size:1.6rem;margin-bottom:.2rem}h2{font-size:1.3rem;border-bottom:2px solid #0072B2;
padding-bottom:.2rem;margin-top:2.2rem}h3{font-size:1.05rem;margin-top:1.4rem}
.subtitle{color:#444;margin-top:0}nav ul{columns:2;font-size:.95rem;list-style:none;padding-left:0}
table{border-collapse:collapse;margin:.6rem 0;font-size:.88rem;font-variant-numeric:tabular-nums}
th,td{border:1px solid #c8c8c8;padding:.25rem .5rem;text-align:left;vertical-align:top}
th,td.num{white-space:nowrap}td{overflow-wrap:anywhere;min-width:4ch}
th{background:#eef3f8;cursor:pointer;user-select:none}th[aria-sort=ascending]::after{content:" ▲"}
th[aria-sort=descending]::after{content:" ▼"}td.num{text-align:right}
tbody tr:nth-child(even){background:#fafafa}tr.hl,tr.hl:nth-child(even){background:#fff1b8}
.note{padding:.35rem .6rem;margin:.5rem 0;border-left:4px solid #56B4E9;background:#f2f8fc}
.note.missing{border-color:#999;background:#f4f4f4;color:#555;font-style:italic}
.note.warning{border-color:#E69F00;background:#fff6e5}
figure{margin:1rem 0}figure img{max-width:100%;height:auto;border:1px solid #ddd}
figcaption{font-size:.92rem;color:#333;margin-top:.3rem}.pager button{margin:0 .3rem}
.tablewrap{overflow-x:auto}
"""

SCRIPT = """
(function(){
function key(td){var s=td.getAttribute('data-sort');if(s===null||s===''){return null;}
var n=Number(s);return isNaN(n)?s:n;}
function cmp(a,b){if(a===null)return b===null?0:1;if(b===null)return -1;
if(typeof a==='number'&&typeof b==='number')return a-b;return String(a).localeCompare(String(b));}
function page(t){var n=parseInt(t.getAttribute('data-page-rows')||'0',10);if(!n)return;
var rows=t.tBodies[0].rows,pages=Math.max(1,Math.ceil(rows.length/n));
var p=Math.min(Math.max(parseInt(t.getAttribute('data-page')||'0',10),0),pages-1);
t.setAttribute('data-page',String(p));for(var i=0;i<rows.length;i++){
rows[i].style.display=(i>=p*n&&i<(p+1)*n)?'':'none';}
var nav=document.getElementById(t.id+'-pager');if(nav){nav.querySelector('span').textContent=
'page '+(p+1)+' of '+pages+' ('+rows.length+' rows)';}}
function sortBy(t,th){var idx=th.cellIndex,asc=th.getAttribute('aria-sort')!=='ascending';
var ths=t.tHead.rows[0].cells;for(var i=0;i<ths.length;i++)ths[i].removeAttribute('aria-sort');
th.setAttribute('aria-sort',asc?'ascending':'descending');var body=t.tBodies[0];
var rows=Array.prototype.slice.call(body.rows);rows.sort(function(a,b){
var r=cmp(key(a.cells[idx]),key(b.cells[idx]));return asc?r:-r;});
rows.forEach(function(r){body.appendChild(r);});t.setAttribute('data-page','0');page(t);}
var tables=document.querySelectorAll('table.sortable');
Array.prototype.forEach.call(tables,function(t){
Array.prototype.forEach.call(t.tHead.rows[0].cells,function(th){
th.addEventListener('click',function(){sortBy(t,th);});});page(t);
var nav=document.getElementById(t.id+'-pager');if(nav){Array.prototype.forEach.call(
nav.querySelectorAll('button'),function(b){b.addEventListener('click',function(){
t.setAttribute('data-page',String(parseInt(t.getAttribute('data-page')||'0',10)+
parseInt(b.getAttribute('data-step'),10)));page(t);});});}});
})();
"""


def _table(t: Table) -> str:
    attrs = f' id="{escape(t.table_id)}"' if t.table_id else ""
    paged = t.page_rows is not None and len(t.rows) > t.page_rows
    if paged:
        attrs += f' data-page-rows="{t.page_rows}" data-page="0"'
    head = "".join(f"<th scope=\"col\">{escape(c)}</th>" for c in t.columns)
    body = []
    for i, row in enumerate(t.rows):
        cls = ' class="hl"' if i < len(t.highlight) and t.highlight[i] else ""
        tds = []
        for cell in row:
            sort = "" if cell.sort is None else escape(repr(cell.sort) if isinstance(cell.sort, float)
                                                         else str(cell.sort), quote=True)
            num = ' class="num"' if isinstance(cell.sort, int | float) else ""
            text = escape(cell.text)
            if cell.href:  # relative: resolves against wherever the report is served
                text = f'<a href="{escape(cell.href, quote=True)}">{text}</a>'
            tds.append(f'<td{num} data-sort="{sort}">{text}</td>')
        body.append(f"<tr{cls}>{''.join(tds)}</tr>")
    caption = f"<caption>{escape(t.caption)}</caption>" if t.caption else ""
    pager = ""
    if paged:
        pager = (f'<div class="pager" id="{escape(t.table_id)}-pager"><button type="button" '
                 'data-step="-1">‹ previous</button><span></span><button type="button" '
                 'data-step="1">next ›</button></div>')
    return (f'<div class="tablewrap"><table class="sortable"{attrs}>{caption}<thead><tr>{head}'
            f"</tr></thead><tbody>{''.join(body)}</tbody></table></div>{pager}")


def _figure(f: Figure) -> str:
    data = base64.b64encode(f.png).decode("ascii")
    return (f'<figure id="fig-{escape(f.name)}"><img src="data:image/png;base64,{data}" '
            f'alt="{escape(f.alt)}"><figcaption>{escape(f.caption)}</figcaption></figure>')


def _block(b: Block) -> str:
    if isinstance(b, Paragraph):
        return f"<p>{escape(b.text)}</p>"
    if isinstance(b, Note):
        return f'<p class="note {escape(b.kind)}">{escape(b.text)}</p>'
    if isinstance(b, Heading):
        return f"<h3>{escape(b.text)}</h3>"
    if isinstance(b, Table):
        return _table(b)
    if isinstance(b, Figure):
        return _figure(b)
    raise TypeError(f"unknown report block {type(b).__name__}")


def _section(s: Section) -> str:
    inner = "\n".join(_block(b) for b in s.blocks)
    return f'<section id="{escape(s.anchor)}">\n<h2>{escape(s.title)}</h2>\n{inner}\n</section>'


def render_html(doc: Document) -> str:
    """The full page as a string (UTF-8)."""
    toc = "".join(f'<li><a href="#{escape(s.anchor)}">{escape(s.title)}</a></li>'
                  for s in doc.sections)
    sections = "\n".join(_section(s) for s in doc.sections)
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
        f"<title>{escape(doc.title)}</title><style>{CSS}</style></head><body>\n"
        f"<header><h1>{escape(doc.title)}</h1><p class=\"subtitle\">{escape(doc.subtitle)}</p>"
        f"<nav><ul>{toc}</ul></nav></header>\n<main>\n{sections}\n</main>\n"
        f"<script>{SCRIPT}</script>\n</body></html>\n"
    )
