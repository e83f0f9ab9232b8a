// Widgets for the dashboard.
import { render } from "./dom.js";

const DEFAULT_COLOR = "blue";

/**
 * A widget draws itself into a container.
 */
export class Widget {
  constructor(name, color = DEFAULT_COLOR) {
    this.name = name;
    this.color = color;
  }

  draw(container) {
    const el = `<div class="${this.color}">{${this.name}}</div>`;
    render(container, el);
  }

  static fromJSON(obj) {
    return new Widget(obj.name, obj.color);
  }
}

export function makeWidgets(names) {
  return names.map((n) => new Widget(n));
}

export const sumSizes = (widgets) => {
  let total = 0;
  for (const w of widgets) {
    total += w.size || 0;
  }
  return total;
};
