"""MiniWoB++ pages as element lists (agent.elements): what a user can act on or read, from the DOM.

One JavaScript call per observation (`SCAN_JS`: document.querySelectorAll and the boxes
getBoundingClientRect gives) lists the task area's buttons, links, text fields (named by their
label, placeholder or the text beside them; a password field shows no value), check boxes and
radios (the box together with its clickable label), selects (and a list box's visible options),
ARIA widgets (jQuery UI's tabs, accordion headers), elements with click handlers (an on<event>
property, d3's or jQuery's listeners, or their own cursor: pointer), and short leaf text (a
dialog's words, a form's labels). The instruction (#query) is left out: it is in the prompt
already. Nested candidates collapse onto one entry: a handler or ARIA container that holds an
actionable element gives way to it (a jQuery UI tab's <li role=tab> to its <a>, which takes the
tab's role and state); what lies inside a kept entry (a button's icon, a label's words) is part
of it. Hidden, zero-size and covered elements (the element at the box's centre is another) are
skipped: a click at an entry's centre acts on that entry.

Pixels. MiniWoB's screenshot (miniwob.screenshot.get_screenshot) crops the viewport's PNG to
the task area's share of it (TASK_WIDTH * png_width // innerWidth PNG pixels wide) and resizes
that to TASK_WIDTH x TASK_HEIGHT; the PNG is innerWidth * devicePixelRatio wide. `screen_scale`
gives the factor from CSS pixels to screenshot pixels that follows (1.0 in MiniWoB's headless
Chromium, where devicePixelRatio is 1); the env divides by the same factor when it turns a
click on the screenshot back into CSS pixels, so a box's centre clicks its element.
"""
from __future__ import annotations

from agent.elements import STATES, Element, ElementError, elements_from_dicts

SOURCE = "dom"
MAX_ELEMENTS = 64  # more is not a compact list; MiniWoB's task areas rarely hold half that
MAX_TEXT = 40  # leaf text longer than this is prose to read in the screenshot, not a target

# arguments: task width and height (CSS px), scale x and y (screenshot px per CSS px), budget (ms),
# most elements, longest leaf text. Returns {items, more: elements left out past the most, nodes, ms};
# throws an Error naming the budget when it runs out.
SCAN_JS = r"""
const [W, H, SX, SY, BUDGET, MAX_ITEMS, MAX_TEXT] = arguments;
const t0 = performance.now();
const query = document.getElementById('query');
const SKIP_IDS = new Set(['wrap', 'area', 'query', 'sync-task-cover', 'reward-display', 'click-canvas']);
const ARIA = {button: 'button', tab: 'tab', link: 'link', checkbox: 'checkbox', radio: 'radio', switch: 'checkbox',
              menuitem: 'menu_item', menuitemcheckbox: 'menu_item', menuitemradio: 'menu_item',
              option: 'list_item', treeitem: 'list_item', combobox: 'combo', textbox: 'text_field',
              searchbox: 'text_field', slider: 'slider', spinbutton: 'text_field'};
const TEXT_TYPES = new Set(['', 'text', 'password', 'email', 'number', 'search', 'tel', 'url', 'date', 'time',
                            'datetime-local', 'month', 'week']);
const BUTTON_TYPES = new Set(['button', 'submit', 'reset', 'image', 'file', 'color']);
const EVENTS = ['click', 'dblclick', 'mousedown', 'mouseup'];
const INLINE = new Set(['SPAN', 'A', 'EM', 'B', 'I', 'STRONG', 'FONT', 'U', 'SMALL', 'MARK', 'LABEL', 'tspan', 'text']);
function budget(stage, i, n) {  // checked at every node: a slow page must not stall the episode
  if (performance.now() - t0 > BUDGET)
    throw new Error('the element scan passed its ' + BUDGET + ' ms budget (' + stage + ' ' + i + ' of ' + n + ')');
}
const fold = s => (s || '').replace(/\s+/g, ' ').trim();
const textOf = el => fold(el.innerText !== undefined ? el.innerText : el.textContent);

function hasHandler(el) {
  for (const ev of EVENTS) {
    if (el['on' + ev] || el['__on' + ev]) return true;  // a DOM property or attribute; d3 v3
  }
  if (Array.isArray(el.__on) && el.__on.some(o => EVENTS.includes(o.type))) return true;  // d3 v4+
  const jq = window.jQuery;
  if (jq && jq._data) {
    const evs = jq._data(el, 'events');
    if (evs && EVENTS.some(e => evs[e])) return true;
  }
  return false;
}

function pointerOrigin(el, style) {  // cursor: pointer set here, not inherited from the parent
  if (style.cursor !== 'pointer') return false;
  const p = el.parentElement;
  return !p || getComputedStyle(p).cursor !== 'pointer';
}

function leafText(el) {
  for (const c of el.children) if (c.tagName !== 'BR') return '';
  const t = fold(el.textContent);
  return t.length <= MAX_TEXT ? t : '';
}

// what el is: {role, kind: native | aria | handler | text} or null
function classify(el, style) {
  const tag = el.tagName;
  if (tag === 'BUTTON') return {role: 'button', kind: 'native'};
  if (tag === 'INPUT') {
    const type = (el.getAttribute('type') || '').toLowerCase();
    if (type === 'hidden') return null;
    if (type === 'checkbox' || type === 'radio') return {role: type, kind: 'native'};
    if (type === 'range') return {role: 'slider', kind: 'native'};
    if (BUTTON_TYPES.has(type)) return {role: 'button', kind: 'native'};
    if (TEXT_TYPES.has(type)) return {role: 'text_field', kind: 'native'};
    return {role: 'other', kind: 'native'};
  }
  if (tag === 'TEXTAREA') return {role: 'text_field', kind: 'native'};
  if (tag === 'SELECT') return {role: 'combo', kind: 'native'};
  if (tag === 'OPTION') return {role: 'list_item', kind: 'native'};
  if (tag === 'A' && (el.hasAttribute('href') || hasHandler(el))) return {role: 'link', kind: 'native'};
  if (el.isContentEditable && !(el.parentElement && el.parentElement.isContentEditable))
    return {role: 'text_field', kind: 'native'};
  const aria = ARIA[(el.getAttribute('role') || '').toLowerCase()];
  if (aria) return {role: aria, kind: 'aria'};
  if (tag === 'LABEL' && el.control) return null;  // merged into its control
  if (hasHandler(el) || pointerOrigin(el, style))
    return {role: INLINE.has(tag) && leafText(el) ? 'link' : 'button', kind: 'handler'};
  if (leafText(el)) return {role: 'label', kind: 'text'};
  return null;
}

function shown(el, style) {
  if (style.display === 'none' || style.visibility === 'hidden' || style.visibility === 'collapse') return false;
  if (parseFloat(style.opacity) === 0) return false;
  if (el.checkVisibility && !el.checkVisibility({checkOpacity: true, checkVisibilityCSS: true,
                                                 opacityProperty: true, visibilityProperty: true})) return false;
  return true;
}

function rectOf(el, style) {
  // an inline element broken over lines: its largest line box, so that the centre is on it
  if (style.display === 'inline') {
    let best = null;
    for (const r of el.getClientRects()) if (!best || r.width * r.height > best.width * best.height) best = r;
    if (best) return [best.left, best.top, best.right, best.bottom];
  }
  const r = el.getBoundingClientRect();
  return [r.left, r.top, r.right, r.bottom];
}

function union(a, b) { return [Math.min(a[0], b[0]), Math.min(a[1], b[1]), Math.max(a[2], b[2]), Math.max(a[3], b[3])]; }

// CSS px -> screenshot px, clipped to the task area; null when nothing of it is left
function toShot(r) {
  const x0 = Math.max(0, r[0]), y0 = Math.max(0, r[1]), x1 = Math.min(W, r[2]), y1 = Math.min(H, r[3]);
  if (x1 - x0 < 1 || y1 - y0 < 1) return null;
  const b = [Math.round(x0 * SX), Math.round(y0 * SY), Math.round(x1 * SX), Math.round(y1 * SY)];
  return (b[2] > b[0] && b[3] > b[1]) ? b : null;
}

function nearbyText(el) {  // the words just before el among its siblings (no other control's, not the instruction's)
  let s = el.previousSibling;
  for (let k = 0; s && k < 4; s = s.previousSibling, k++) {
    if (s.nodeType === 1 && (s.matches('input, select, textarea, button') || s.querySelector('input, select, textarea, button')
                             || (query && (s === query || s.contains(query))))) return '';
    const t = fold(s.nodeType === 1 ? (s.innerText || s.textContent) : s.textContent);
    if (t) return t.slice(0, MAX_TEXT);
  }
  return '';
}

function labelText(el) {
  const labels = el.labels ? Array.from(el.labels) : [];
  return fold(labels.map(textOf).join(' '));
}

function nameOf(el, role) {
  const tag = el.tagName;
  const attr = n => fold(el.getAttribute(n));
  if (role === 'text_field' || role === 'combo' || role === 'slider')
    return labelText(el) || attr('aria-label') || attr('placeholder') || attr('title') || nearbyText(el);
  if (role === 'checkbox' || role === 'radio') {
    if (tag === 'INPUT') {
      let t = labelText(el) || attr('aria-label');
      if (!t) {  // the words just after the box
        const s = el.nextSibling;
        t = s ? fold(s.nodeType === 1 ? s.innerText : s.textContent).slice(0, MAX_TEXT) : '';
      }
      return t;
    }
    return textOf(el) || attr('aria-label');
  }
  if (tag === 'INPUT') return fold(el.value) || attr('aria-label') || attr('title') || attr('alt');
  const img = el.querySelector && el.querySelector('img[alt]');
  return textOf(el) || attr('aria-label') || attr('title') || (img ? fold(img.alt) : '') || classHint(el);
}

// a nameless icon (a star, a trash can, a spinner's arrow): its class names, less jQuery UI's styling ones
function classHint(el) {
  const names = (el.getAttribute('class') || '').split(/\s+/)
    .filter(c => c && !/^ui-(corner|state|widget|helper|priority|front|button$|icon$)/.test(c));
  return names.join(' ').slice(0, MAX_TEXT);
}

const nodes = document.body ? document.body.querySelectorAll('*') : [];
const cands = [];
const byEl = new Map();
for (let i = 0; i < nodes.length; i++) {
  budget('node', i, nodes.length);
  const el = nodes[i];
  if (SKIP_IDS.has(el.id) || (query && query.contains(el)) || el.tagName === 'SCRIPT' || el.tagName === 'STYLE') continue;
  const style = getComputedStyle(el);
  if (!shown(el, style)) continue;
  const c = classify(el, style);
  if (!c) continue;
  c.el = el; c.style = style; c.drop = false;
  cands.push(c);
  byEl.set(el, c);
}
const nearest = (el, pred) => {
  for (let p = el.parentElement; p; p = p.parentElement) {
    const c = byEl.get(p);
    if (c && pred(c)) return c;
  }
  return null;
};
// a handler or ARIA container holding an actionable element gives way to it; the element takes a
// tab's (menu item's, list item's) role and states when it is that widget's own link or button
for (const c of cands) {
  if (c.kind === 'text') continue;
  const box = nearest(c.el, o => o.kind === 'aria' || o.kind === 'handler');
  if (!box) continue;
  box.drop = true;
  const bare = c.el.tagName === 'A' || ['presentation', 'none'].includes(c.el.getAttribute('role'));
  if (['tab', 'menu_item', 'list_item'].includes(box.role) && bare) {
    c.role = box.role; c.widget = box.el;
  }
}
// what lies inside a kept entry is part of it (a select's visible options aside)
for (const c of cands) {
  if (c.drop) continue;
  const owner = nearest(c.el, o => !o.drop && o.kind !== 'text');
  if (owner && !(owner.el.tagName === 'SELECT' && c.el.tagName === 'OPTION')) c.drop = true;
  const lab = c.el.parentElement && c.el.parentElement.closest('label');
  if (c.kind === 'text' && lab && lab.control) c.drop = true;  // words of a control's label name the control
}
const items = [];
let more = 0;
for (let k = 0; k < cands.length; k++) {
  budget('candidate', k, cands.length);
  const c = cands[k];
  if (c.drop) continue;
  const el = c.el;
  let r = rectOf(el, c.style);
  // a check box or radio with its clickable label: one box, named by the label
  const label = (c.role === 'checkbox' || c.role === 'radio') && el.labels && el.labels.length ? el.labels[0] : null;
  if (label && shown(label, getComputedStyle(label))) {
    const lr = label.getBoundingClientRect();
    if (lr.width > 0 && lr.height > 0) r = union(r, [lr.left, lr.top, lr.right, lr.bottom]);
  }
  const box = toShot(r);
  if (!box) continue;
  // covered: whatever is at the centre must be this element (or its label)
  const hit = document.elementFromPoint((box[0] + box[2]) / 2 / SX, (box[1] + box[3]) / 2 / SY);
  const sel = el.tagName === 'OPTION' ? el.closest('select') : null;
  if (!hit || !(el.contains(hit) || (label && label.contains(hit)) || (sel && hit === sel))) continue;
  if (items.length >= MAX_ITEMS) { more++; continue; }
  const w = c.widget || el;
  const states = [];
  if (el.checked || w.getAttribute('aria-checked') === 'true') states.push('checked');
  if ((el.tagName === 'OPTION' && el.selected) || w.getAttribute('aria-selected') === 'true') states.push('selected');
  if (el.disabled || w.getAttribute('aria-disabled') === 'true') states.push('disabled');
  if (document.activeElement === el) states.push('focused');
  if (w.getAttribute('aria-expanded') === 'true') states.push('expanded');
  const password = el.tagName === 'INPUT' && (el.getAttribute('type') || '').toLowerCase() === 'password';
  if (password) states.push('password');
  let value = null;
  if (c.role === 'text_field' && !password) value = el.isContentEditable ? fold(el.innerText) : String(el.value);
  else if (el.tagName === 'SELECT') value = el.selectedIndex >= 0 ? fold(el.options[el.selectedIndex].text) : '';
  else if (c.role === 'slider' && el.tagName === 'INPUT') value = el.value + ' of ' + el.min + '-' + el.max;
  items.push({role: c.role, name: nameOf(el, c.role), box: box, states: states, value: value});
}
return {items: items, more: more, nodes: nodes.length, ms: performance.now() - t0};
"""


def screen_scale(inner_width: float, inner_height: float, device_pixel_ratio: float,
                 task_width: int, task_height: int) -> tuple[float, float]:
    """Screenshot pixels per CSS pixel, as miniwob.screenshot.get_screenshot makes its image: the
    viewport's PNG (innerWidth x innerHeight CSS px at devicePixelRatio) cropped to
    task_width * png_width // innerWidth PNG px (likewise in height), resized to task_width x task_height."""
    for name, v in (("inner_width", inner_width), ("inner_height", inner_height),
                    ("device_pixel_ratio", device_pixel_ratio)):
        if not (isinstance(v, (int, float)) and v > 0):
            raise ValueError(f"screen_scale: {name} must be a positive number, got {v!r}")
    png_w, png_h = round(inner_width * device_pixel_ratio), round(inner_height * device_pixel_ratio)
    crop_w, crop_h = task_width * png_w // int(inner_width), task_height * png_h // int(inner_height)
    if crop_w < 1 or crop_h < 1:
        raise ValueError(f"screen_scale: a {inner_width}x{inner_height} viewport holds no {task_width}x{task_height} task area")
    return device_pixel_ratio * task_width / crop_w, device_pixel_ratio * task_height / crop_h


def css_to_screen(rect, scale: tuple[float, float], width: int, height: int) -> tuple[int, int, int, int] | None:
    """A CSS-pixel rectangle (left, top, right, bottom) as a screenshot-pixel box, clipped to the
    task area (width x height CSS px); None when nothing of it is inside. SCAN_JS does the same in
    the page."""
    left, top, right, bottom = (float(v) for v in rect)
    x0, y0, x1, y1 = max(0.0, left), max(0.0, top), min(float(width), right), min(float(height), bottom)
    if x1 - x0 < 1 or y1 - y0 < 1:
        return None
    sx, sy = scale
    # JavaScript's Math.round: halves go up
    box = tuple(int(_js_round(v)) for v in (x0 * sx, y0 * sy, x1 * sx, y1 * sy))
    return box if box[2] > box[0] and box[3] > box[1] else None


def _js_round(v: float) -> float:
    import math

    return math.floor(v + 0.5)


def read_elements(driver, scale: tuple[float, float], width: int, height: int,
                  budget_s: float) -> tuple[list[Element] | None, str]:
    """(elements, source) of the page now: (list, "dom"), or (None, why) when the scan failed
    (it ran past `budget_s`, which the page's script checks at every node, the page's script
    threw, or what it returned was malformed). A page too busy to run the scan at all is the
    step's to cut (the env's step_timeout)."""
    from selenium.common.exceptions import WebDriverException

    try:
        out = driver.execute_script(SCAN_JS, width, height, scale[0], scale[1], int(budget_s * 1000),
                                    MAX_ELEMENTS, MAX_TEXT)
    except WebDriverException as e:
        msg = (getattr(e, "msg", None) or str(e)).strip().splitlines()
        return None, f"no element list: the page's DOM scan failed ({msg[0] if msg else type(e).__name__})"
    try:
        if not isinstance(out, dict):
            raise ElementError(f"the DOM scan returned {type(out).__name__}, not an object")
        items = out.get("items")
        if isinstance(items, list):
            for d in items:  # the platform's states in agent.elements' order
                if isinstance(d, dict) and isinstance(d.get("states"), list):
                    d["states"] = [s for s in STATES if s in d["states"]]
        return elements_from_dicts(items, "DOM scan"), SOURCE
    except ElementError as e:
        return None, f"no element list: {e}"
