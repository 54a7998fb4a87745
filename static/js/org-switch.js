// The top bar's organization picker switches as soon as another one is chosen.
const select = document.getElementById("org-switch");
if (select) select.addEventListener("change", () => select.form.submit());
