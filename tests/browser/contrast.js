// WCAG 2 contrast of every visible text against its effective background, run in the page under test.
// Returns a list of failures: {tag, id, cls, text, color, background, ratio} with ratio < minRatio.
// The effective background of an element is the alpha-composite of the background colours of the element and its
// ancestors, from the first opaque one (or a white page) down; text colour is composited over it too. Elements
// whose background chain holds a background image (gradient, picture) cannot be judged here: they are listed in
// `skipped`, never silently passed.
(minRatio) => {
  const canvas = document.createElement("canvas");
  canvas.width = canvas.height = 1;
  const ctx = canvas.getContext("2d", {willReadFrequently: true});

  function parse(css) {
    const m = css.match(/^rgba?\(\s*([\d.]+)[ ,]+([\d.]+)[ ,]+([\d.]+)(?:\s*[,/]\s*([\d.]+)(%?))?\s*\)$/);
    if (m) {
      let a = m[4] === undefined ? 1 : parseFloat(m[4]);
      if (m[5] === "%") a /= 100;
      return [parseFloat(m[1]), parseFloat(m[2]), parseFloat(m[3]), a];
    }
    // any other CSS colour syntax (color(srgb ...), oklch(...)): let the canvas convert it
    ctx.clearRect(0, 0, 1, 1);
    ctx.fillStyle = "rgba(0, 0, 0, 0)";
    ctx.fillStyle = css;
    ctx.fillRect(0, 0, 1, 1);
    const d = ctx.getImageData(0, 0, 1, 1).data;
    return [d[0], d[1], d[2], d[3] / 255];
  }

  function over(top, bottom) {  // source-over of an rgba colour on an opaque rgb one
    const a = top[3];
    return [0, 1, 2].map((i) => top[i] * a + bottom[i] * (1 - a)).concat([1]);
  }

  function luminance(rgb) {
    const lin = rgb.slice(0, 3).map((v) => {
      const c = v / 255;
      return c <= 0.04045 ? c / 12.92 : Math.pow((c + 0.055) / 1.055, 2.4);
    });
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2];
  }

  function ratio(a, b) {
    const la = luminance(a), lb = luminance(b);
    return (Math.max(la, lb) + 0.05) / (Math.min(la, lb) + 0.05);
  }

  function background(el) {  // null when an image sits in the chain
    const layers = [];
    for (let node = el; node && node.nodeType === 1; node = node.parentElement) {
      if (node instanceof SVGElement && !(node instanceof SVGSVGElement)) continue;
      const style = getComputedStyle(node);
      if (style.backgroundImage && style.backgroundImage !== "none") return null;
      const c = parse(style.backgroundColor);
      if (c[3] > 0) layers.push(c);
      if (c[3] >= 1) break;
    }
    let bg = [255, 255, 255, 1];
    for (let i = layers.length - 1; i >= 0; i--) bg = over(layers[i], bg);
    return bg;
  }

  const skipTags = new Set(["SCRIPT", "STYLE", "NOSCRIPT", "TEMPLATE", "TITLE", "OPTION", "OPTGROUP"]);
  const failures = [], skipped = [];
  let checked = 0;
  for (const el of document.body.querySelectorAll("*")) {
    if (skipTags.has(el.tagName.toUpperCase())) continue;
    const text = Array.from(el.childNodes).filter((n) => n.nodeType === 3).map((n) => n.textContent).join("").trim();
    if (!text) continue;
    if (!el.checkVisibility({checkOpacity: true, checkVisibilityCSS: true})) continue;
    const rect = el.getBoundingClientRect();
    if (rect.width === 0 || rect.height === 0) continue;
    const style = getComputedStyle(el);
    const bg = background(el);
    const summary = {tag: el.tagName.toLowerCase(), id: el.id, cls: el.getAttribute("class") || "",
                     text: text.slice(0, 40)};
    if (bg === null) { skipped.push(summary); continue; }
    const fg = over(parse(el instanceof SVGElement ? style.fill : style.color), bg);
    const r = ratio(fg, bg);
    checked += 1;
    if (r < minRatio) {
      failures.push({...summary, color: style.color, background: `rgb(${bg.slice(0, 3).map(Math.round)})`,
                     ratio: Math.round(r * 1000) / 1000});
    }
  }
  return {checked, failures, skipped};
}
