// MathJax reads this before it loads (mkdocs.yml lists it first). pymdownx.arithmatex writes each
// formula as \(...\) or \[...\] inside an element of class "arithmatex": typeset only those.
window.MathJax = {
  tex: {
    inlineMath: [["\\(", "\\)"]],
    displayMath: [["\\[", "\\]"]],
    processEscapes: false,
    processEnvironments: true,
  },
  options: {
    ignoreHtmlClass: ".*|",
    processHtmlClass: "arithmatex",
  },
  svg: { fontCache: "global" },
};
