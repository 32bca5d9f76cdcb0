/*
 * cli_plot.c - a hand-written SVG line plot for `moex train`: y[0..n) against the step
 * index, linear x axis (to the first tick at or past n - 1), log10 y axis, with axes, ticks,
 * grid lines, labels and a title.
 */
#include "cli_plot.h"

#include <math.h>
#include <stdio.h>

#define PLOT_W 720.0
#define PLOT_H 440.0
#define MARGIN_L 78.0
#define MARGIN_R 24.0
#define MARGIN_T 40.0
#define MARGIN_B 56.0
#define MAX_POINTS 2000   /* longer curves are thinned to about this many vertices */

/* A "nice" tick step (1, 2 or 5 times a power of ten) giving about `target` ticks. */
static double nice_step(double range, int target) {
    double raw = range / (double)target;
    double p = pow(10.0, floor(log10(raw)));
    double f = raw / p;
    double m = f <= 1.0 ? 1.0 : f <= 2.0 ? 2.0 : f <= 5.0 ? 5.0 : 10.0;
    return m * p;
}

/* Text of a tick label on the log axis: 1e-3, 2e-3, ... or plain numbers near 1. */
static void log_label(char *buf, size_t len, double v) {
    int e = (int)floor(log10(v) + 1e-9);
    double mant = v / pow(10.0, e);
    if (e >= -2 && e <= 3)
        snprintf(buf, len, "%g", v);
    else if (fabs(mant - 1.0) < 1e-6)
        snprintf(buf, len, "1e%d", e);
    else
        snprintf(buf, len, "%.0fe%d", mant, e);
}

int cli_plot_svg(const char *path, const char *title, const char *xlabel, const char *ylabel,
                 const double *y, int64_t n) {
    FILE *f = fopen(path, "w");
    if (!f) return -1;

    /* y range over the finite positive values, in decades */
    double ymin = INFINITY, ymax = 0.0;
    for (int64_t i = 0; i < n; i++) {
        if (isfinite(y[i]) && y[i] > 0.0) {
            if (y[i] < ymin) ymin = y[i];
            if (y[i] > ymax) ymax = y[i];
        }
    }
    if (!(ymax > 0.0)) { ymin = 0.1; ymax = 1.0; }
    double d0 = floor(log10(ymin)), d1 = ceil(log10(ymax));
    if (d1 <= d0) d1 = d0 + 1.0;
    /* the x axis ends at the first tick at or past the last step, so that the labels reach
     * it (steps 0..4999 of 5000: ticks every 1000 up to 5000, not 4000) */
    const double xlast = n > 1 ? (double)(n - 1) : 1.0;
    const double xstep = nice_step(xlast, 8);
    const double xmax = ceil(xlast / xstep - 1e-9) * xstep;

    const double pw = PLOT_W - MARGIN_L - MARGIN_R, ph = PLOT_H - MARGIN_T - MARGIN_B;
#define SX(v) (MARGIN_L + (v) / xmax * pw)
#define SY(v) (MARGIN_T + (d1 - log10(v)) / (d1 - d0) * ph)

    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
               "viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\" font-size=\"12\">\n",
            PLOT_W, PLOT_H, PLOT_W, PLOT_H);
    fprintf(f, "<rect x=\"0\" y=\"0\" width=\"%.0f\" height=\"%.0f\" fill=\"white\"/>\n", PLOT_W, PLOT_H);
    fprintf(f, "<text x=\"%.1f\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">%s</text>\n",
            MARGIN_L + pw / 2, title);

    /* y ticks: every decade, plus 2x and 5x when the range is at most three decades */
    fprintf(f, "<g stroke=\"#e4e4e4\" stroke-width=\"1\">\n");
    for (double d = d0; d <= d1 + 1e-9; d += 1.0) {
        for (int m = 1; m <= 9; m++) {
            double v = (double)m * pow(10.0, d);
            if (log10(v) > d1 + 1e-9) break;
            fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"%s/>\n", MARGIN_L, SY(v),
                    MARGIN_L + pw, SY(v), m == 1 ? " stroke=\"#c8c8c8\"" : "");
        }
    }
    fprintf(f, "</g>\n<g text-anchor=\"end\">\n");
    for (double d = d0; d <= d1 + 1e-9; d += 1.0) {
        for (int m = 1; m <= 9; m++) {
            double v = (double)m * pow(10.0, d);
            if (log10(v) > d1 + 1e-9) break;
            if (!(m == 1 || (d1 - d0 <= 3.0 && (m == 2 || m == 5)))) continue;
            char lab[32];
            log_label(lab, sizeof lab, v);
            fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n",
                    MARGIN_L - 5, SY(v), MARGIN_L, SY(v));
            fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">%s</text>\n", MARGIN_L - 8, SY(v) + 4, lab);
        }
    }
    fprintf(f, "</g>\n");

    /* x ticks */
    fprintf(f, "<g text-anchor=\"middle\">\n");
    for (int i = 0; (double)i * xstep <= xmax * (1.0 + 1e-9); i++) {
        const double v = (double)i * xstep;
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e4e4e4\"/>\n", SX(v),
                MARGIN_T, SX(v), MARGIN_T + ph);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n", SX(v),
                MARGIN_T + ph, SX(v), MARGIN_T + ph + 5);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">%g</text>\n", SX(v), MARGIN_T + ph + 19, v);
    }
    fprintf(f, "</g>\n");

    /* axes and labels */
    fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"black\"/>\n",
            MARGIN_L, MARGIN_T, pw, ph);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n", MARGIN_L + pw / 2,
            PLOT_H - 14, xlabel);
    fprintf(f, "<text x=\"18\" y=\"%.1f\" text-anchor=\"middle\" transform=\"rotate(-90 18 %.1f)\">%s</text>\n",
            MARGIN_T + ph / 2, MARGIN_T + ph / 2, ylabel);

    /* the curve: thinned to about MAX_POINTS vertices; non-positive values are skipped */
    int64_t stride = n > MAX_POINTS ? (n + MAX_POINTS - 1) / MAX_POINTS : 1;
    fprintf(f, "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"1.5\" points=\"");
    for (int64_t i = 0; i < n; i += stride) {
        if (isfinite(y[i]) && y[i] > 0.0) fprintf(f, "%.1f,%.1f ", SX((double)i), SY(y[i]));
    }
    if (n > 0 && (n - 1) % stride != 0 && isfinite(y[n - 1]) && y[n - 1] > 0.0)
        fprintf(f, "%.1f,%.1f", SX((double)(n - 1)), SY(y[n - 1]));
    fprintf(f, "\"/>\n</svg>\n");
#undef SX
#undef SY
    return fclose(f) == 0 ? 0 : -1;
}
