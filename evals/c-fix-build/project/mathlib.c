double mean(const double *v, int n) {
    double sum = 0;
    for (int i = 0; i < n; i++)
        sum += v[i];
    return n ? sum / n : 0;
}

double maximum(const double *v, int n) {
    double best = v[0];
    for (int i = 1; i < n; i++)
        if (v[i] > best)
            best = v[i];
    return best;
}
