function evaluate(inputs, outputs, trace) {
  // Return a score (0..1), a boolean, or an object of metrics.
  return outputs === inputs.correct_answer ? 1.0 : 0.0;
}

module.exports = { evaluate };
