# gnuplot -e "dat='OUT/mopd.dat'; png='docs/img/rl-mopd.png'; ta=0.601; tp=0.304" scripts/rl_mopd_plot.gp
# (ta, tp: the arithmetic and Python teachers' held-out pass@1, from OUT/mopd.dat's comments)
set terminal pngcairo size 900,420 font "sans,10" noenhanced
set output png
set multiplot layout 1,2
set xlabel "iteration"
set ylabel "held-out pass@1"
set yrange [0.15:0.7]
set key bottom right
set grid
set title "Students on arithmetic (200 problems, 4 samples)"
plot dat index 0 using 1:2 with linespoints lw 2 pt 7 title "MOPD, two domain teachers", \
     dat index 1 using 1:2 with linespoints lw 2 pt 5 title "SFT on the teachers' samples", \
     dat index 2 using 1:2 with linespoints lw 2 pt 9 title "MOPD, one mixed teacher", \
     ta with lines dt 2 lw 2 lc rgb "black" title "arithmetic teacher", \
     0.95 * ta with lines dt 3 lw 1 lc rgb "gray40" title "95% of it"
set title "Students on Python (200 problems, 4 samples)"
set key top left
plot dat index 3 using 1:2 with linespoints lw 2 pt 7 title "MOPD, two domain teachers", \
     dat index 4 using 1:2 with linespoints lw 2 pt 5 title "SFT on the teachers' samples", \
     dat index 5 using 1:2 with linespoints lw 2 pt 9 title "MOPD, one mixed teacher", \
     tp with lines dt 2 lw 2 lc rgb "black" title "Python teacher"
unset multiplot
