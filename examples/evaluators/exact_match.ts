type Inputs = Record<string, unknown>;

export function evaluate(inputs: Inputs, outputs: unknown, trace: unknown): number {
  // Return a score (0..1), a boolean, or an object of metrics.
  return outputs === inputs.correct_answer ? 1.0 : 0.0;
}
